//! Stored PDUs: `Pdu::from_stored` on any text, then what reading one does
//! (its canonical object, content as the client format reads it, the
//! redaction target, the reference hash and redaction of the whole event).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ruma::canonical_json::{CanonicalJsonObject, redact};
use seqline::room::pdu::Pdu;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (id, json) = text.split_once('\n').unwrap_or(("$event", text));
    let Ok(pdu) = Pdu::from_stored(id, json) else { return };
    let _ = pdu.content_as::<CanonicalJsonObject>();
    for version in [ruma::RoomVersionId::V10, ruma::RoomVersionId::V11, ruma::RoomVersionId::V12] {
        let rules = version.rules().unwrap();
        let _ = pdu.redaction_target(&rules.redaction);
        if let Ok(object) = pdu.canonical() {
            let _ = ruma::signatures::reference_hash(&object, &rules);
            let _ = redact(object, &rules.redaction, None);
        }
    }
});
