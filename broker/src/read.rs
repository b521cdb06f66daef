//! Reading a connection's packets: the CONNECT first (another protocol
//! level refused as soon as its byte is in), then packets whose buffers
//! grow with what arrives, against the clients' shared budget and a
//! deadline for large ones.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rumqttc::mqttbytes::v4::Packet;
use rumqttc::mqttbytes::Error as CodecError;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::connect::peek_level;

/// KiB of read buffers beyond the first 64 KiB of each that clients may
/// hold together (a packet being read); the coordinator's is apart.
pub(crate) const READ_BUFFERS_KIB: usize = 96 * 1024;
/// A packet larger than the first 64 KiB must arrive whole this soon after
/// it started, or its sender is closed: a half-sent packet holds memory.
const LARGE_PACKET_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest CONNECT taken (before a client has logged in, it holds no
/// more than this of the broker's memory; Tunefleet's are a few hundred bytes).
const MAX_CONNECT_BYTES: usize = 64 * 1024;

/// What a reader holds of the clients' read-buffer budget.
pub(crate) struct ReadRoom {
    /// `None` for the coordinator's own connection (not counted).
    pub budget: Option<Arc<Semaphore>>,
    pub held: Option<OwnedSemaphorePermit>,
}

impl ReadRoom {
    /// Grows `buf` by up to `want` bytes: the first 64 KiB free, the rest
    /// against the budget (waiting for room; only this reader waits).
    async fn reserve(&mut self, buf: &mut BytesMut, want: usize) -> Result<(), ReadError> {
        let step = want.clamp(1024, 64 * 1024);
        let after = buf.len() + step;
        if let (Some(budget), true) = (&self.budget, after > 64 * 1024) {
            let need = u32::try_from((after - 64 * 1024).div_ceil(1024)).map_err(|_| ReadError::TooSlow)?;
            let have = self.held.as_ref().map_or(0, OwnedSemaphorePermit::num_permits) as u32;
            if need > have {
                let more = budget.clone().acquire_many_owned(need - have).await.map_err(|_| ReadError::TooSlow)?;
                match &mut self.held {
                    Some(h) => h.merge(more),
                    None => self.held = Some(more),
                }
            }
        }
        buf.reserve(step);
        Ok(())
    }

    /// Gives back what an emptied buffer no longer needs.
    pub fn release(&mut self) {
        self.held = None;
    }
}

/// Reads one packet, waiting for more bytes as needed; the buffer grows
/// with what arrives, never by what a header announces.
pub(crate) async fn read_packet<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut BytesMut,
    max: usize,
    room: &mut ReadRoom,
) -> Result<Option<Packet>, ReadError> {
    let mut large_since: Option<tokio::time::Instant> = None;
    loop {
        match Packet::read(buf, max) {
            Ok(p) => return Ok(Some(p)),
            Err(CodecError::InsufficientBytes(n)) => {
                if buf.len() >= 64 * 1024 {
                    let since = *large_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > LARGE_PACKET_TIMEOUT {
                        return Err(ReadError::TooSlow);
                    }
                }
                if buf.capacity() - buf.len() < n.min(1024) {
                    let wait = LARGE_PACKET_TIMEOUT.saturating_sub(large_since.map_or(Duration::ZERO, |s| s.elapsed()));
                    tokio::time::timeout(wait, room.reserve(buf, n)).await.map_err(|_| ReadError::TooSlow)??;
                }
                let read = match large_since {
                    Some(since) => {
                        let left = LARGE_PACKET_TIMEOUT.saturating_sub(since.elapsed());
                        tokio::time::timeout(left, stream.read_buf(buf)).await.map_err(|_| ReadError::TooSlow)?
                    }
                    None => stream.read_buf(buf).await,
                };
                if read.map_err(|_| ReadError::Io)? == 0 {
                    return Ok(None);
                }
            }
            Err(e) => return Err(ReadError::Codec(e)),
        }
    }
}

#[derive(Debug)]
pub(crate) enum ReadError {
    /// The socket failed (reset, TLS error): the connection is lost either way.
    Io,
    Codec(CodecError),
    /// A large packet did not arrive whole in [`LARGE_PACKET_TIMEOUT`].
    TooSlow,
    /// A CONNECT of another protocol level (MQTT 3.1: 3, MQTT 5: 5).
    Level(u8),
}

/// Reads the CONNECT, refusing other protocol levels as soon as their level byte is in.
pub(crate) async fn read_connect<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut BytesMut,
) -> Result<Option<Packet>, ReadError> {
    loop {
        if let Some(level) = peek_level(buf).filter(|l| *l != 4) {
            return Err(ReadError::Level(level));
        }
        match Packet::read(buf, MAX_CONNECT_BYTES) {
            Ok(p) => return Ok(Some(p)),
            Err(CodecError::InsufficientBytes(n)) => {
                buf.reserve(n.clamp(64, MAX_CONNECT_BYTES));
                if stream.read_buf(buf).await.map_err(|_| ReadError::Io)? == 0 {
                    return Ok(None);
                }
            }
            Err(e) => return Err(ReadError::Codec(e)),
        }
    }
}
