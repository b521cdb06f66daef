//! The checksum the disk workload ([`crate::disk`]) keeps over what it
//! reads back, and its reports print: FNV-1a over 64-bit words.

use std::fmt;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A 64-bit checksum: FNV-1a over little-endian 64-bit words. Printed as 16
/// hex digits, a JSON string: a JSON number would lose bits, and a checksum
/// is not a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checksum(pub u64);

impl Checksum {
    /// The checksum of nothing, where every fold starts.
    pub const EMPTY: Checksum = Checksum(FNV_OFFSET);

    /// This checksum with `word` folded in.
    pub fn with(self, word: u64) -> Checksum {
        Checksum((self.0 ^ word).wrapping_mul(FNV_PRIME))
    }

    /// The checksum of `bytes`: their 8-byte words, then the bytes left over
    /// one by one.
    pub fn of(bytes: &[u8]) -> Checksum {
        let words = bytes.chunks_exact(8);
        let rest = words.remainder();
        let sum = words.fold(Checksum::EMPTY, |sum, chunk| {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            sum.with(u64::from_le_bytes(word))
        });
        rest.iter().fold(sum, |sum, &byte| sum.with(u64::from(byte)))
    }

    /// The checksums in `parts`, folded in order.
    pub fn fold(parts: impl IntoIterator<Item = Checksum>) -> Checksum {
        parts.into_iter().fold(Checksum::EMPTY, |sum, part| sum.with(part.0))
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl serde::Serialize for Checksum {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
