//! Encoding of protocol messages: one version byte, then the postcard body.
//!
//! Decoding never panics: an empty payload, another protocol version, an
//! oversized payload or a body that does not decode are all [`CodecError`]s.

use serde::{de::DeserializeOwned, Serialize};

/// Version of the wire format. Bumped whenever any message changes shape.
pub const PROTOCOL_VERSION: u8 = 14;

/// Largest payload either side accepts (logs are truncated well below this).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// Why a payload was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("empty payload")]
    Empty,
    #[error("protocol version {got}, this build speaks version {expected}")]
    Version { got: u8, expected: u8 },
    #[error("payload of {size} bytes exceeds the {max}-byte limit")]
    TooLarge { size: usize, max: usize },
    #[error("payload does not decode: {0}")]
    Decode(String),
    #[error("message does not encode: {0}")]
    Encode(String),
}

/// Encodes `msg` as version byte + postcard body.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![PROTOCOL_VERSION];
    postcard::to_io(msg, &mut out).map_err(|e| CodecError::Encode(e.to_string()))?;
    Ok(out)
}

/// Protocol versions whose stored results an agent still reads and sends
/// again in this version (9 changed only the probe plan of an assignment,
/// 10 added the co-measurement messages, 11 bundles, 12 the signed refusal
/// of a Hello, 13 the GPUs, 14 encrypted sealed frames, no change to a
/// result): an upgraded agent loses nothing an older one
/// stored and never saw acknowledged. A bump that changes a result's shape
/// says here how an older one is read, or starts the list again.
pub const STORED_RESULT_VERSIONS: &[u8] = &[8, 9, 10, 11, 12, 13, PROTOCOL_VERSION];

/// Versions whose result is this version's without the GPU readings: 13
/// appended `Measurement::gpus` and `Measurement::cpu_share`, the last
/// fields of the last field of a `TrialResult`, so such a result ends
/// where they begin and reads as one with neither (an empty list is one
/// byte, its length 0; `None` one byte, 0).
const RESULT_BEFORE_GPUS: &[u8] = &[8, 9, 10, 11, 12];

/// Decodes a payload produced by [`encode`]. Trailing bytes are an error:
/// a payload is exactly one message.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    decode_versions(payload, &[PROTOCOL_VERSION])
}

/// Decodes a result an agent stored (see [`STORED_RESULT_VERSIONS`]).
pub fn decode_stored_result(payload: &[u8]) -> Result<crate::message::TrialResult, CodecError> {
    match payload.split_first() {
        Some((version, body)) if RESULT_BEFORE_GPUS.contains(version) && payload.len() <= MAX_MESSAGE_BYTES => {
            let mut now = Vec::with_capacity(payload.len() + 1);
            now.push(PROTOCOL_VERSION);
            now.extend_from_slice(body);
            now.extend_from_slice(&[0, 0]);
            decode(&now)
        }
        _ => decode_versions(payload, STORED_RESULT_VERSIONS),
    }
}

fn decode_versions<T: DeserializeOwned>(payload: &[u8], versions: &[u8]) -> Result<T, CodecError> {
    if payload.len() > MAX_MESSAGE_BYTES {
        return Err(CodecError::TooLarge { size: payload.len(), max: MAX_MESSAGE_BYTES });
    }
    let (&version, body) = payload.split_first().ok_or(CodecError::Empty)?;
    if !versions.contains(&version) {
        return Err(CodecError::Version { got: version, expected: PROTOCOL_VERSION });
    }
    let (msg, rest) = postcard::take_from_bytes(body).map_err(|e| CodecError::Decode(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CodecError::Decode(format!("{} trailing bytes", rest.len())));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{AgentMessage, WorkRequest};

    #[test]
    fn rejects_other_version_empty_and_trailing() {
        let msg = AgentMessage::Request(WorkRequest { seq: 3, free: 2, ahead: 0, running: vec![], held: vec![] });
        let mut bytes = encode(&msg).expect("encodes");
        assert_eq!(decode::<AgentMessage>(&bytes), Ok(msg));
        assert_eq!(decode::<AgentMessage>(&[]), Err(CodecError::Empty));
        bytes.push(0);
        assert!(matches!(decode::<AgentMessage>(&bytes), Err(CodecError::Decode(_))));
        bytes[0] = PROTOCOL_VERSION + 1;
        assert_eq!(
            decode::<AgentMessage>(&bytes),
            Err(CodecError::Version { got: PROTOCOL_VERSION + 1, expected: PROTOCOL_VERSION })
        );
        let big = vec![PROTOCOL_VERSION; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(decode::<AgentMessage>(&big), Err(CodecError::TooLarge { .. })));
    }

    #[test]
    fn a_result_stored_before_the_gpu_readings_reads_as_one_without_them() {
        use crate::measurement::{EnergyReading, EnergySourceKind, ExitOutcome, GpuEnergy, GpuMethod, Measurement};
        use crate::message::{TrialRef, TrialResult};
        let trial = TrialRef { study: "s".into(), study_id: 1, trial: 2, attempt: 1 };
        let mut m = Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Rapl, ""));
        m.interference = vec!["charging".into()];
        let old = TrialResult { trial: trial.clone(), measurement: m.clone() };
        let mut bytes = encode(&old).expect("encodes");
        assert_eq!(bytes.split_off(bytes.len() - 2), [0, 0], "no GPU, no share");
        for v in [8, 12] {
            bytes[0] = v;
            assert_eq!(decode_stored_result(&bytes), Ok(old.clone()), "version {v}");
            assert!(decode::<TrialResult>(&bytes).is_err(), "a live message is this version only");
        }
        bytes[0] = 7;
        assert!(matches!(decode_stored_result(&bytes), Err(CodecError::Version { got: 7, .. })));
        m.gpus = vec![GpuEnergy {
            index: 0,
            uuid: "GPU-a".into(),
            joules: 5.5,
            method: GpuMethod::Counter,
            valid: true,
            note: None,
        }];
        m.cpu_share = Some(0.5);
        let now = TrialResult { trial, measurement: m };
        assert_eq!(decode_stored_result(&encode(&now).expect("encodes")), Ok(now));
    }
}
