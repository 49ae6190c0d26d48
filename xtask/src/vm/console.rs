//! The serial-console protocol between the VM's init and the host: the
//! markers init prints around the command it runs, with the command's exit
//! status in the closing one, and reading them back out of everything the
//! console carried (kernel messages included).

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};

/// The markers of one boot. The nonce makes them unique to it, so that
/// output that merely mentions a marker (a command printing this file, an
/// earlier boot's log) is never taken for one.
#[derive(Debug, Clone)]
pub struct Markers {
    nonce: String,
}

/// What a finished command left on the console.
#[derive(Debug, PartialEq, Eq)]
pub struct Finished {
    /// The command's output (stdout and stderr as the console interleaved
    /// them), lines ending in `\n`.
    pub output: String,
    /// Its exit status as the shell reports it (128+N after signal N).
    pub status: i32,
}

impl Markers {
    pub fn new(nonce: impl Into<String>) -> Markers {
        Markers {
            nonce: nonce.into(),
        }
    }

    /// A nonce from the clock, this process's id and a count of the
    /// nonces it made (boots at once may read the same clock).
    pub fn fresh() -> Markers {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let count = MADE.fetch_add(1, Ordering::Relaxed);
        Markers::new(format!("{:x}{:x}-{count}", std::process::id(), nanos))
    }

    /// The line init prints just before starting the command.
    pub fn begin(&self) -> String {
        format!("@@profilerd-vm-begin-{}@@", self.nonce)
    }

    /// The closing line's text before the status; init prints
    /// `{end_prefix}STATUS@@`.
    pub fn end_prefix(&self) -> String {
        format!("@@profilerd-vm-end-{}-status=", self.nonce)
    }

    /// Whether a console line holds the closing marker.
    pub fn is_end(&self, line: &str) -> bool {
        line.contains(&self.end_prefix())
    }

    /// Whether a console line holds the opening marker. A marker need not
    /// start its line: the firmware's screen resets and kernel messages
    /// share the serial line with init's output.
    pub fn is_begin(&self, line: &str) -> bool {
        line.contains(&self.begin())
    }

    /// The command's output and status out of the whole console log.
    pub fn parse(&self, console: &str) -> Result<Finished> {
        let begin = self.begin();
        let end = self.end_prefix();
        let mut output = String::new();
        let mut started = false;
        for raw in console.lines() {
            let line = clean(raw);
            if !started {
                started = line.contains(&begin);
                continue;
            }
            if let Some((before, rest)) = line.split_once(&end) {
                let Some(status) = rest.strip_suffix("@@").and_then(|s| s.parse().ok()) else {
                    bail!("the VM's closing marker is malformed: {line:?}");
                };
                // Output without a final newline ends on the marker's line.
                output.push_str(before);
                return Ok(Finished { output, status });
            }
            output.push_str(line);
            output.push('\n');
        }
        if started {
            bail!("the command started in the VM but its end never reached the console");
        }
        bail!("the VM never started the command (no begin marker on the console)");
    }
}

/// A console line without the serial line discipline's carriage returns.
pub fn clean(line: &str) -> &str {
    line.trim_end_matches(['\r', '\n'])
}

/// `arg` as one word of a POSIX shell command line: as is when it has
/// nothing the shell would interpret, else in single quotes.
pub fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The command line `args` as shell words.
pub fn shell_command(args: &[String]) -> String {
    args.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn markers() -> Markers {
        Markers::new("abc")
    }

    #[test]
    fn parses_output_and_status_between_markers() {
        let m = markers();
        let console = format!(
            "[    0.000000] Linux version 6.1\r\nnoise\r\n{}\r\nhello\r\nworld\r\n{}3@@\r\n[ 9.1] reboot: Power down\r\n",
            m.begin(),
            m.end_prefix()
        );
        let got = m.parse(&console).unwrap();
        assert_eq!(
            got,
            Finished {
                output: "hello\nworld\n".into(),
                status: 3
            }
        );
    }

    #[test]
    fn markers_inside_lines() {
        let m = markers();
        // SeaBIOS's screen reset has no newline; a command's last line may
        // lack one.
        let console = format!(
            "Booting from ROM...\r\n\u{1b}c\u{1b}[2J{}\r\nline\r\nno newline{}0@@\r\n",
            m.begin(),
            m.end_prefix()
        );
        let got = m.parse(&console).unwrap();
        assert_eq!(got.output, "line\nno newline");
        assert!(m.is_begin(&format!("\u{1b}[2J{}\r\n", m.begin())));
        assert!(m.is_end(&format!("x{}0@@", m.end_prefix())));
    }

    #[test]
    fn empty_output_and_zero_status() {
        let m = markers();
        let console = format!("{}\n{}0@@\n", m.begin(), m.end_prefix());
        let got = m.parse(&console).unwrap();
        assert_eq!(got.output, "");
        assert_eq!(got.status, 0);
    }

    #[test]
    fn other_boots_markers_are_output() {
        let m = markers();
        let other = Markers::new("xyz");
        let console = format!(
            "{}\n{}\n{}7@@\n{}1@@\n",
            m.begin(),
            other.begin(),
            other.end_prefix(),
            m.end_prefix()
        );
        let got = m.parse(&console).unwrap();
        assert_eq!(got.status, 1);
        assert_eq!(got.output.lines().count(), 2);
    }

    #[test]
    fn missing_markers_say_which() {
        let m = markers();
        let none = m.parse("Kernel panic - not syncing\n").unwrap_err();
        assert!(none.to_string().contains("never started"), "{none}");
        let cut = m
            .parse(&format!("{}\npartial output\n", m.begin()))
            .unwrap_err();
        assert!(cut.to_string().contains("never reached"), "{cut}");
        let bad = m
            .parse(&format!("{}\n{}x@@\n", m.begin(), m.end_prefix()))
            .unwrap_err();
        assert!(bad.to_string().contains("malformed"), "{bad}");
    }

    #[test]
    fn fresh_markers_differ() {
        assert_ne!(Markers::fresh().begin(), Markers::new("").begin());
        // Boots at once make theirs in the same instant.
        let (a, b) = (Markers::fresh(), Markers::fresh());
        assert_ne!(a.begin(), b.begin());
        assert!(!a.is_end(&format!("{}0@@", b.end_prefix())));
        assert!(markers().is_begin("@@profilerd-vm-begin-abc@@\r"));
        assert!(markers().is_end("@@profilerd-vm-end-abc-status=0@@\r"));
    }

    #[test]
    fn quotes_only_what_the_shell_would_interpret() {
        assert_eq!(shell_quote("--profiles=cpu,heap"), "--profiles=cpu,heap");
        assert_eq!(shell_quote("/bin/profilerd"), "/bin/profilerd");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        let args: Vec<String> = ["sh", "-c", "echo $1; exit 3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(shell_command(&args), "sh -c 'echo $1; exit 3'");
    }
}
