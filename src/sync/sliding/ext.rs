//! Sliding sync extensions (`../shared/SLIDING-SYNC.md` §A.6): to-device
//! messages, end-to-end encryption state, account data, receipts and
//! typing. Each is off unless the request says `enabled: true`; `lists`
//! and `rooms` restrict the room-scoped ones to the rooms of those lists
//! and subscriptions (default: all).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::list::Selection;
use crate::storage::receipts::Receipt;

/// An extension's request.
#[derive(Debug, Clone, Default)]
pub struct Ext {
    /// `enabled: true` was sent.
    pub enabled: bool,
    /// List names whose rooms it covers (`None`: all).
    lists: Option<Vec<String>>,
    /// Subscribed rooms it covers (`None`: all).
    rooms: Option<Vec<String>>,
    /// The rest of the request (`since`, `limit`).
    pub raw: Value,
}

/// The most to-device messages one answer carries.
pub const TO_DEVICE_LIMIT: i64 = 100;

impl Ext {
    /// Reads extension `name` of the request's extensions.
    pub fn of(extensions: &BTreeMap<String, Value>, name: &str) -> Self {
        let Some(raw) = extensions.get(name) else { return Self::default() };
        let names = |field: &str| -> Option<Vec<String>> {
            let list: Vec<String> =
                raw[field].as_array()?.iter().filter_map(Value::as_str).map(str::to_owned).collect();
            (!list.iter().any(|n| n == "*")).then_some(list)
        };
        Self {
            enabled: raw["enabled"].as_bool() == Some(true),
            lists: names("lists"),
            rooms: names("rooms"),
            raw: raw.clone(),
        }
    }

    /// Whether this extension covers room `id` of `selection` (a room of
    /// one of its lists, or one of its subscriptions).
    pub fn covers(&self, selection: &Selection<'_>, id: &str) -> bool {
        if !self.enabled {
            return false;
        }
        let by_list = selection.in_lists.get(id).is_some_and(|&bits| match &self.lists {
            None => bits != 0,
            Some(wanted) => selection
                .lists
                .keys()
                .enumerate()
                .any(|(i, name)| bits & (1 << i.min(127)) != 0 && wanted.iter().any(|w| w == name)),
        });
        let by_subscription = selection.subscribed.contains(id)
            && self.rooms.as_ref().is_none_or(|wanted| wanted.iter().any(|r| r == id));
        by_list || by_subscription
    }

    /// `to_device.since`: the position of the last message the device has.
    pub fn since(&self) -> Option<i64> {
        match &self.raw["since"] {
            Value::String(s) => s.parse().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
        .filter(|s| *s >= 0)
    }

    /// `to_device.limit`, at most [`TO_DEVICE_LIMIT`].
    pub fn limit(&self) -> i64 {
        self.raw["limit"].as_i64().filter(|l| *l > 0).map_or(TO_DEVICE_LIMIT, |l| l.min(TO_DEVICE_LIMIT))
    }
}

/// A room's receipts as one `m.receipt` event, by the rule `/sync` uses
/// ([`crate::sync::receipt_contents`]: others' private receipts left out);
/// the extension has room for one event per room, so a user's further
/// receipt of one type at one event in another thread is left out.
pub fn receipt_event(receipts: &[Receipt], me: &str) -> Option<Value> {
    let content = crate::sync::receipt_contents(receipts, me).into_iter().next()?;
    Some(json!({ "type": "m.receipt", "content": content }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extension_scope_and_fields() {
        let exts = BTreeMap::from([
            ("typing".to_owned(), json!({ "enabled": true, "lists": ["all"] })),
            ("to_device".to_owned(), json!({ "enabled": true, "since": "42", "limit": 1000 })),
            ("receipts".to_owned(), json!({ "enabled": false })),
        ]);
        let selection = Selection {
            lists: [("all", (1, vec!["!a"])), ("dms", (1, vec!["!b"]))].into_iter().collect(),
            in_lists: [("!a", 0b01), ("!b", 0b10)].into_iter().collect(),
            subscribed: ["!c"].into_iter().collect(),
            ..Selection::default()
        };
        let typing = Ext::of(&exts, "typing");
        let covered: Vec<&str> =
            ["!a", "!b", "!c", "!d"].into_iter().filter(|r| typing.covers(&selection, r)).collect();
        assert_eq!(covered, vec!["!a", "!c"]);
        assert!(!Ext::of(&exts, "receipts").covers(&selection, "!a"));
        assert!(!Ext::of(&exts, "e2ee").enabled);
        let to_device = Ext::of(&exts, "to_device");
        assert_eq!((to_device.since(), to_device.limit()), (Some(42), TO_DEVICE_LIMIT));
    }

    #[test]
    fn private_receipts_of_others_are_left_out() {
        let r = |user: &str, kind: &str| Receipt {
            room_id: "!r".into(),
            user_id: user.into(),
            receipt_type: kind.into(),
            thread_id: String::new(),
            event_id: "$e".into(),
            ts: 1,
        };
        let got = receipt_event(
            &[r("@me:x", "m.read.private"), r("@a:x", "m.read.private"), r("@a:x", "m.read")],
            "@me:x",
        )
        .unwrap();
        assert_eq!(got["content"]["$e"]["m.read.private"].as_object().unwrap().len(), 1);
        assert_eq!(got["content"]["$e"]["m.read"]["@a:x"]["ts"], 1);
        assert!(receipt_event(&[r("@a:x", "m.read.private")], "@me:x").is_none());
    }
}
