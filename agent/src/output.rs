//! Workload output, read with bounded memory: a line reader that truncates
//! absurdly long lines, and the tail of log lines kept for the measurement.

use std::collections::VecDeque;
use std::io;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// Longest line kept from the workload; the rest of a longer line is skipped.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Lines kept in the log tail.
pub const TAIL_LINES: usize = 50;
/// Bytes kept in the log tail.
pub const TAIL_BYTES: usize = 8 * 1024;
/// Longest single line kept in the log tail.
pub const TAIL_LINE_BYTES: usize = 1024;

/// One line of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The text (invalid UTF-8 replaced), without its terminator.
    pub text: String,
    /// True when the line was longer than the reader's limit.
    pub truncated: bool,
}

/// Reads lines of at most `max` bytes; the excess of a longer line is skipped
/// without being buffered. Asynchronous: the agent reads a workload's pipes
/// on its event loop, with no thread per stream.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    max: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        LineReader { inner, max }
    }

    /// The next line, or `None` at end of input.
    pub async fn next_line(&mut self) -> io::Result<Option<Line>> {
        let mut buf = Vec::new();
        let mut truncated = false;
        let mut seen_any = false;
        loop {
            let chunk = match self.inner.fill_buf().await {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                if !seen_any {
                    return Ok(None);
                }
                break;
            }
            seen_any = true;
            let (part, used, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (&chunk[..i], i + 1, true),
                None => (chunk, chunk.len(), false),
            };
            let room = self.max.saturating_sub(buf.len());
            if part.len() > room {
                truncated = true;
            }
            buf.extend_from_slice(&part[..part.len().min(room)]);
            self.inner.consume(used);
            if done {
                break;
            }
        }
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        Ok(Some(Line { text: String::from_utf8_lossy(&buf).into_owned(), truncated }))
    }
}

/// The last lines of log output, bounded in lines and bytes.
#[derive(Debug, Clone)]
pub struct LogTail {
    lines: VecDeque<String>,
    bytes: usize,
    max_lines: usize,
    max_bytes: usize,
    dropped: u64,
}

impl Default for LogTail {
    fn default() -> Self {
        LogTail::new(TAIL_LINES, TAIL_BYTES)
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl LogTail {
    pub fn new(max_lines: usize, max_bytes: usize) -> Self {
        LogTail { lines: VecDeque::new(), bytes: 0, max_lines, max_bytes, dropped: 0 }
    }

    /// Adds a line, dropping the oldest ones to stay within bounds.
    pub fn push(&mut self, line: &str, truncated: bool) {
        // Room for the ellipsis (3 bytes) and the newline.
        let limit = TAIL_LINE_BYTES.min(self.max_bytes.saturating_sub(4));
        let mut text = cut(line, limit).to_string();
        if truncated || text.len() < line.len() {
            text.push('…');
        }
        self.bytes += text.len() + 1;
        self.lines.push_back(text);
        while self.lines.len() > self.max_lines || self.bytes > self.max_bytes {
            match self.lines.pop_front() {
                Some(old) => {
                    self.bytes -= old.len() + 1;
                    self.dropped += 1;
                }
                None => break,
            }
        }
    }

    /// Lines dropped from the front so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The kept lines, each followed by a newline.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(self.bytes);
        for line in &self.lines {
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Line> {
        // A tiny buffer so lines span several fill_buf calls.
        let mut r = LineReader::new(tokio::io::BufReader::with_capacity(4, input), max);
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(async {
            let mut out = Vec::new();
            while let Some(l) = r.next_line().await.expect("in-memory read") {
                out.push(l);
            }
            out
        })
    }

    #[test]
    fn splits_lines_and_truncates_long_ones() {
        let got = lines(b"ab\r\ncdefghij\n\nlast", 5);
        let texts: Vec<_> = got.iter().map(|l| (l.text.as_str(), l.truncated)).collect();
        assert_eq!(texts, vec![("ab", false), ("cdefg", true), ("", false), ("last", false)]);
        assert!(lines(b"", 5).is_empty());
        assert_eq!(lines(b"\xff\n", 5)[0].text, "\u{fffd}");
    }

    #[test]
    fn tail_keeps_last_lines_within_bounds() {
        let mut tail = LogTail::new(3, 1000);
        for i in 0..10 {
            tail.push(&format!("line {i}"), false);
        }
        assert_eq!(tail.render(), "line 7\nline 8\nline 9\n");
        assert_eq!(tail.dropped(), 7);

        let mut tail = LogTail::new(50, 100);
        for _ in 0..1000 {
            tail.push(&"x".repeat(5000), false);
        }
        let text = tail.render();
        assert!(!text.is_empty() && text.len() <= 100, "{}", text.len());
        assert!(text.ends_with("…\n"));
    }
}
