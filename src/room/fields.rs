//! A filter's `event_fields`: the fields of each event the client wants
//! (dot-separated paths, `\.` for a dot inside a name), applied to the events
//! of `/sync`, `/messages` and `/context`. Without the list every field is
//! sent.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The most paths one filter may list.
pub const MAX_EVENT_FIELDS: usize = 100;

/// The parsed paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFields(Vec<Vec<String>>);

impl EventFields {
    /// Parses a filter's list; `None` (all fields) for no list or an empty
    /// one. A path with an empty part or a dangling escape is 400 M_BAD_JSON.
    pub fn parse(list: Option<&[String]>) -> Result<Option<Self>> {
        let Some(list) = list.filter(|l| !l.is_empty()) else { return Ok(None) };
        if list.len() > MAX_EVENT_FIELDS {
            return Err(Error::BadJson(format!("event_fields lists more than {MAX_EVENT_FIELDS} fields")));
        }
        list.iter().map(|p| split(p)).collect::<Result<Vec<_>>>().map(|paths| Some(Self(paths)))
    }

    /// The event with only the listed fields (those it has).
    pub fn apply(&self, event: &Value) -> Value {
        let mut out = Map::new();
        for path in &self.0 {
            copy(event, &mut out, path);
        }
        Value::Object(out)
    }

    /// Applies the fields to every event of an array.
    pub fn apply_all(&self, events: &mut Value) {
        if let Some(list) = events.as_array_mut() {
            for event in list {
                *event = self.apply(event);
            }
        }
    }

    /// Applies the fields to the room events of a `/sync` answer (timeline
    /// and state, of joined and left rooms).
    pub fn apply_to_sync(&self, sync: &mut Value) {
        for section in ["join", "leave"] {
            let Some(rooms) = sync["rooms"][section].as_object_mut() else { continue };
            for room in rooms.values_mut() {
                for part in ["timeline", "state", "state_after", "org.matrix.msc4222.state_after"] {
                    if let Some(events) = room.get_mut(part).and_then(|p| p.get_mut("events")) {
                        self.apply_all(events);
                    }
                }
            }
        }
    }
}

/// `content.m\.relates_to` -> ["content", "m.relates_to"].
fn split(path: &str) -> Result<Vec<String>> {
    let bad = || Error::BadJson(format!("Invalid event_fields entry {path:?}"));
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => part.push(chars.next().ok_or_else(bad)?),
            '.' => parts.push(std::mem::take(&mut part)),
            c => part.push(c),
        }
    }
    parts.push(part);
    if parts.iter().any(String::is_empty) {
        return Err(bad());
    }
    Ok(parts)
}

fn copy(from: &Value, to: &mut Map<String, Value>, path: &[String]) {
    let Some((first, rest)) = path.split_first() else { return };
    let Some(value) = from.get(first) else { return };
    if rest.is_empty() {
        to.insert(first.clone(), value.clone());
        return;
    }
    if !value.is_object() {
        return;
    }
    let entry = to.entry(first.clone()).or_insert_with(|| Value::Object(Map::new()));
    if let Some(inner) = entry.as_object_mut() {
        copy(value, inner, rest);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(list: &[&str]) -> EventFields {
        let list: Vec<String> = list.iter().map(|s| (*s).to_owned()).collect();
        EventFields::parse(Some(&list)).unwrap().unwrap()
    }

    #[test]
    fn keeps_only_the_listed_paths() {
        let event = json!({
            "type": "m.room.message", "sender": "@a:x", "event_id": "$e",
            "content": { "body": "hi", "msgtype": "m.text", "m.relates_to": { "rel_type": "m.thread" } },
            "unsigned": { "age": 5 },
        });
        assert_eq!(
            fields(&["type", "content.body", "content.m\\.relates_to", "content.missing", "sender.deeper"])
                .apply(&event),
            json!({ "type": "m.room.message", "content": { "body": "hi", "m.relates_to": { "rel_type": "m.thread" } } })
        );
    }

    #[test]
    fn empty_or_absent_list_keeps_everything_and_bad_paths_are_refused() {
        assert_eq!(EventFields::parse(None).unwrap(), None);
        assert_eq!(EventFields::parse(Some(&[])).unwrap(), None);
        for bad in ["", "content.", ".type", "content..body", "type\\"] {
            assert!(EventFields::parse(Some(&[bad.to_owned()])).is_err(), "{bad}");
        }
        let many: Vec<String> = (0..=MAX_EVENT_FIELDS).map(|i| format!("f{i}")).collect();
        assert!(EventFields::parse(Some(&many)).is_err());
    }
}
