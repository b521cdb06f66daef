//! Everything a stranger can put on the wire: payloads for both directions,
//! and topic names. Nothing may panic; what decodes must encode back to the
//! same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tunefleet_common::message::{AgentMessage, CoordinatorMessage, CoordinatorStatus};
use tunefleet_common::topic::Topics;
use tunefleet_common::{decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = decode::<AgentMessage>(data) {
        let again = encode(&msg).expect("a decoded message encodes");
        assert_eq!(decode::<AgentMessage>(&again).ok(), Some(msg));
    }
    if let Ok(msg) = decode::<CoordinatorMessage>(data) {
        let again = encode(&msg).expect("a decoded message encodes");
        assert_eq!(decode::<CoordinatorMessage>(&again).ok(), Some(msg));
    }
    let _ = decode::<CoordinatorStatus>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Topics::default().parse(text);
    }
});
