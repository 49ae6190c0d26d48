//! Text that other processes control (process and thread names, /proc
//! files, mapped file paths) made safe to use: bytes that are not UTF-8 are
//! replaced rather than refused, and control characters are escaped so that
//! a name cannot split a log line or forge a label.

use std::borrow::Cow;
use std::io;
use std::path::Path;

/// `s` with every control character (newline, escape, ...) written as its
/// Rust escape (`\n`, `\u{1b}`); borrowed when there is none.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A name given as bytes (a comm, up to its NUL if any), as label text:
/// invalid UTF-8 replaced by U+FFFD, control characters escaped.
pub fn display_name(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    escape_controls(&String::from_utf8_lossy(&bytes[..end])).into_owned()
}

/// Reads a /proc text file whose fields may hold a process name (status,
/// stat): a name that is not UTF-8 must not make the whole file unreadable.
pub fn read_proc_text(path: impl AsRef<Path>) -> io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_the_rest_kept() {
        assert!(matches!(escape_controls("a/b c"), Cow::Borrowed("a/b c")));
        assert_eq!(escape_controls("a\nb\x1b[0m\t"), "a\\nb\\u{1b}[0m\\t");
        assert_eq!(escape_controls("é→"), "é→");
    }

    #[test]
    fn names_are_lossy_up_to_nul() {
        assert_eq!(display_name(b"ok/x\n\xff\0junk"), "ok/x\\n\u{fffd}");
        assert_eq!(display_name(b""), "");
        assert_eq!(display_name(b"\xc3("), "\u{fffd}(");
    }

    #[test]
    fn proc_text_is_read_lossily() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("status");
        std::fs::write(&path, b"Name:\tx\xffy\nTgid:\t7\n").expect("write");
        let text = read_proc_text(&path).expect("read");
        assert!(text.contains("Tgid:\t7"), "{text}");
        assert!(text.starts_with("Name:\tx\u{fffd}y"), "{text}");
        assert!(read_proc_text(dir.path().join("missing")).is_err());
    }
}
