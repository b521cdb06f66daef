//! Everything a stranger can put on the wire: payloads for both directions,
//! and topic names. Nothing may panic; what decodes must encode, and decode
//! again to the same bytes (compared as bytes: a NaN never equals itself).
//! What decodes also goes through the coordinator's checks of every field
//! (`validate`), a Hello through the cheap checks and its AgentInfo bounds,
//! and text through the join-token parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tunefleet_common::auth::{self, DownFrame, Signed, UpFrame};
use tunefleet_common::message::{AgentMessage, CoordinatorMessage};
use tunefleet_common::topic::Topics;
use tunefleet_common::{decode, encode};
use tunefleet_coordinator::domain::validate;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = decode::<AgentMessage>(data) {
        let bytes = encode(&msg).expect("a decoded message encodes");
        let again = decode::<AgentMessage>(&bytes).expect("its encoding decodes");
        assert_eq!(encode(&again).expect("encodes"), bytes);
        let _ = validate::message(&msg);
    }
    if let Ok(msg) = decode::<CoordinatorMessage>(data) {
        let bytes = encode(&msg).expect("a decoded message encodes");
        let again = decode::<CoordinatorMessage>(&bytes).expect("its encoding decodes");
        assert_eq!(encode(&again).expect("encodes"), bytes);
    }
    // Frames, and the signature checks a stranger's bytes reach first.
    if let Ok(UpFrame::Hello(signed)) = decode::<UpFrame>(data) {
        if let Ok(hello) = auth::peek_hello(&signed) {
            let _ = validate::agent_info(&hello.info);
        }
        let _ = auth::open_hello(&signed);
    }
    if let Ok(DownFrame::Stale(signed)) = decode::<DownFrame>(data) {
        let _ = auth::open_stale(&[0; 32], &signed);
    }
    if let Ok(signed) = decode::<Signed>(data) {
        let _ = auth::open_status(&signed);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Topics::default().parse(text);
        let _ = text.parse::<auth::JoinToken>();
    }
});
