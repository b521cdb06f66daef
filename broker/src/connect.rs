//! What a CONNECT is checked for before anything else: its protocol level
//! (refused as each specification asks when it is not MQTT 3.1.1) and the
//! secrets it carries (compared whole).

use tokio::io::{AsyncWrite, AsyncWriteExt};

/// The protocol level of a CONNECT at the start of `buf`, once its bytes
/// are in (`None` before, or when `buf` does not start with a CONNECT).
pub(crate) fn peek_level(buf: &[u8]) -> Option<u8> {
    if buf.first()? & 0xF0 != 0x10 {
        return None;
    }
    // The remaining length: one to four bytes, seven bits each.
    let mut i = 1;
    loop {
        let byte = *buf.get(i)?;
        i += 1;
        if byte & 0x80 == 0 {
            break;
        }
        if i > 4 {
            return None;
        }
    }
    let name_len = usize::from(u16::from_be_bytes([*buf.get(i)?, *buf.get(i + 1)?]));
    buf.get(i + 2 + name_len).copied()
}

/// The CONNACK refusing a CONNECT of protocol `level`: MQTT 5's own form
/// with reason 0x84 (Unsupported Protocol Version, MQTT 5 3.1.2.2), or the
/// 3.1.1 form with return code 1 (unacceptable protocol version, MQTT 3.1.1
/// 3.1.2.2), which MQTT 3.1 clients read the same way.
pub(crate) fn refusal_for_level(level: u8) -> &'static [u8] {
    if level >= 5 {
        &[0x20, 0x03, 0x00, 0x84, 0x00]
    } else {
        &[0x20, 0x02, 0x00, 0x01]
    }
}

/// Answers a CONNECT of another protocol level, then the caller closes.
pub(crate) async fn refuse_level<W: AsyncWrite + Unpin>(writer: &mut W, level: u8) {
    let _ = writer.write_all(refusal_for_level(level)).await;
    let _ = writer.flush().await;
}

/// Compares a secret in time that does not depend on where it differs
/// (only on the lengths), so its bytes cannot be found one by one by timing.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_is_read_from_every_protocol_name() {
        // MQTT 3.1.1: "MQTT", level 4.
        assert_eq!(peek_level(&[0x10, 0x0c, 0, 4, b'M', b'Q', b'T', b'T', 4, 2]), Some(4));
        // MQTT 5: level 5.
        assert_eq!(peek_level(&[0x10, 0x0d, 0, 4, b'M', b'Q', b'T', b'T', 5]), Some(5));
        // MQTT 3.1: "MQIsdp", level 3; a two-byte remaining length.
        assert_eq!(peek_level(&[0x10, 0x80, 0x01, 0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3]), Some(3));
        assert_eq!(peek_level(&[0x10, 0x0c, 0, 4, b'M', b'Q']), None, "not in yet");
        assert_eq!(peek_level(&[0x30, 0x0c, 0, 4, b'M', b'Q', b'T', b'T', 5]), None, "not a CONNECT");
        assert_eq!(peek_level(&[0x10, 0xff, 0xff, 0xff, 0xff, 0]), None, "a length of five bytes");
        assert_eq!(refusal_for_level(5)[3], 0x84);
        assert_eq!(refusal_for_level(3)[3], 0x01);
    }
}
