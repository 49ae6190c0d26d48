//! `profilerd flamegraph`: the merged stacks as folded lines ("root;...;leaf
//! value") drawn by the `inferno` crate into an SVG, which is written to a
//! hidden temporary file beside the output and renamed over it, so the
//! output is complete or absent.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use inferno::flamegraph::{self, Options};

use super::ReportError;
use super::stacks::Stacks;
use super::units::{self, Target};

/// The largest sum of values drawn: inferno adds the values up in a
/// `usize`, and past 2^53 its floating-point widths lose precision anyway.
const MAX_DRAWN: u128 = 1 << 53;

/// What the values are divided by so that their sum fits [`MAX_DRAWN`]:
/// 1 for any real profile, more for files whose values are huge.
fn divisor(stacks: &Stacks) -> i64 {
    let sum: u128 = drawn(stacks).map(|s| s.value as u128).sum();
    // At most (2^63 * 2^32) / 2^53 = 2^42 for any number of stacks that fits
    // in memory, so the conversion holds.
    i64::try_from(sum.div_ceil(MAX_DRAWN))
        .unwrap_or(i64::MAX)
        .max(1)
}

/// The stacks a flame graph draws: non-empty, with positive values.
fn drawn(stacks: &Stacks) -> impl Iterator<Item = &super::stacks::Stack> {
    stacks
        .stacks
        .iter()
        .filter(|s| s.value > 0 && !s.frames.is_empty())
}

/// Folded stacks, root first, one line per distinct stack with a positive
/// value (divided by [`divisor`]; those that become 0 are too small to
/// draw). Frame names lose the characters the format uses as separators.
pub fn folded(stacks: &Stacks) -> Vec<String> {
    let names: Vec<String> = stacks.names.iter().map(|n| clean(n)).collect();
    let divisor = divisor(stacks);
    let mut lines: Vec<String> = drawn(stacks)
        .filter(|s| s.value / divisor > 0)
        .map(|s| {
            let mut line = String::new();
            for (i, &frame) in s.frames.iter().rev().enumerate() {
                if i > 0 {
                    line.push(';');
                }
                line.push_str(names.get(frame.name as usize).map_or("", String::as_str));
            }
            line.push(' ');
            line.push_str(&(s.value / divisor).to_string());
            line
        })
        .collect();
    // inferno merges adjacent equal prefixes: it needs sorted lines.
    lines.sort_unstable();
    lines
}

/// A frame name as one field of a folded line: ';' separates frames and a
/// line break ends the line; an empty name would leave a hole.
fn clean(name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| match c {
            ';' => ',',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    let name = name.trim();
    if name.is_empty() {
        "<unknown>".to_owned()
    } else {
        name.to_owned()
    }
}

/// Draws the SVG into memory.
pub fn render(stacks: &Stacks) -> Result<Vec<u8>, ReportError> {
    let lines = folded(stacks);
    if lines.is_empty() {
        return Err(ReportError::NoSamples {
            sample_type: stacks.sample_type.clone(),
            files: stacks.files.len(),
        });
    }
    let mut options = Options::default();
    options.title = format!(
        "{} profile: {} ({})",
        stacks.profile_type, stacks.sample_type, stacks.unit
    );
    let mut subtitle = format!(
        "total {}",
        units::label(stacks.total, &stacks.unit, Target::Auto)
    );
    if stacks.time_nanos > 0 {
        let start =
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(stacks.time_nanos as u64);
        subtitle.push_str(&format!(
            " in {} from {}",
            units::label(stacks.duration_nanos, "nanoseconds", Target::Auto),
            humantime::format_rfc3339_seconds(start)
        ));
    }
    match stacks.files.as_slice() {
        [one] => subtitle.push_str(&format!(", {}", one.display())),
        many => subtitle.push_str(&format!(", {} files", many.len())),
    }
    options.subtitle = Some(subtitle);
    // Tooltips count in a unit where 1% of the total is at least 1 (ms for
    // seconds of CPU, kB for megabytes), not in nanoseconds or bytes.
    let (count_name, factor) = display_unit(stacks);
    options.count_name = count_name;
    options.factor = factor * divisor(stacks) as f64;
    // Colors from the names, so that two runs give the same picture.
    options.hash = true;
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .map_err(ReportError::Render)?;
    Ok(svg)
}

/// The unit of the tooltips' counts and the factor from sample units to it.
fn display_unit(stacks: &Stacks) -> (String, f64) {
    let hundredth = stacks.total / 100;
    let (scaled, unit) = units::scale(hundredth.max(1), &stacks.unit, Target::Auto);
    if unit.is_empty() {
        let name = match stacks.unit.as_str() {
            "" | "count" => stacks.sample_type.clone(),
            other => other.to_owned(),
        };
        return (name, 1.0);
    }
    (unit.to_owned(), scaled / hundredth.max(1) as f64)
}

/// Writes `bytes` to `path` through a hidden temporary file in the same
/// directory, fsynced and renamed over `path`: readers never see half a
/// file, and a failure leaves nothing behind. Only a regular file is
/// replaced: a rename over a device, a directory or a symlink would
/// replace the node itself (for root, `/dev/null` with an SVG).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let err = |source: io::Error| ReportError::Write {
        path: path.to_owned(),
        source,
    };
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_file() => {
            return Err(err(io::Error::other("it exists and is not a regular file")));
        }
        _ => {}
    }
    let file_name = path.file_name().ok_or_else(|| {
        err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name",
        ))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let tmp = TempFile(dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    )));
    // create_new: never write through a stale file or a planted symlink.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp.0)
        .map_err(err)?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(err)?;
    drop(file);
    fs::rename(&tmp.0, path).map_err(err)?;
    tmp.disarm();
    Ok(())
}

/// Removes the temporary file unless it was renamed into place.
struct TempFile(PathBuf);

impl TempFile {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::stacks::load;
    use crate::report::stacks::tests::{profile, write};

    fn stacks(samples: &[(&[&str], i64, i64)]) -> (tempfile::TempDir, Stacks) {
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "cpu-x.pb.gz", &profile(samples));
        let s = load(&[f], None).unwrap();
        (dir, s)
    }

    #[test]
    fn folded_lines_are_root_first_and_clean() {
        let (_dir, s) = stacks(&[
            (&["leaf+mid", "main"], 1, 30),
            (&["f<[u8; 8]>", "main"], 1, 10),
            (&["f<[u8; 8]>", "main"], 1, 5),
        ]);
        assert_eq!(folded(&s), ["main;f<[u8, 8]> 15", "main;mid;leaf 30"]);
    }

    #[test]
    fn huge_values_are_scaled_to_fit() {
        let (_dir, s) = stacks(&[
            (&["a", "main"], 1, i64::MAX),
            (&["b", "main"], 1, i64::MAX),
            (&["c", "main"], 1, 1),
        ]);
        let d = divisor(&s);
        assert_eq!(d, (2 * (i64::MAX as u128)).div_ceil(MAX_DRAWN) as i64);
        let expected = (i64::MAX / d).to_string();
        assert_eq!(
            folded(&s),
            [format!("main;a {expected}"), format!("main;b {expected}")]
        );
        let svg = String::from_utf8(render(&s).unwrap()).unwrap();
        assert!(svg.contains("<title>a ("), "{svg}");
    }

    #[test]
    fn svg_names_profile_and_sample_type() {
        let (_dir, s) = stacks(&[
            (&["burn_a", "main"], 3, 3_000_000_000),
            (&["burn_b", "main"], 1, 1_000_000_000),
        ]);
        let svg = String::from_utf8(render(&s).unwrap()).unwrap();
        assert!(svg.contains("cpu profile: cpu (nanoseconds)"), "{svg}");
        assert!(
            svg.contains("<title>burn_a (3,000 ms, 75.00%)</title>"),
            "{svg}"
        );
    }

    #[test]
    fn tooltips_count_in_a_readable_unit() {
        let (_dir, mut s) = stacks(&[(&["f"], 1, 4_000_000_000)]);
        assert_eq!(display_unit(&s), ("ms".to_owned(), 1e-6));
        s.unit = "bytes".into();
        s.total = 50 << 20;
        assert_eq!(display_unit(&s), ("kB".to_owned(), 1.0 / 1024.0));
        s.unit = "count".into();
        s.sample_type = "samples".into();
        assert_eq!(display_unit(&s), ("samples".to_owned(), 1.0));
    }

    #[test]
    fn nothing_to_draw_is_an_error() {
        let (_dir, s) = stacks(&[(&["f"], 1, 0)]);
        let err = render(&s).unwrap_err();
        assert_eq!(err.exit_code(), 1);
        assert!(err.to_string().contains("no samples"), "{err}");
    }

    #[test]
    fn atomic_write_replaces_or_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("f.svg");
        write_atomically(&out, b"one").unwrap();
        write_atomically(&out, b"two").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"two");
        // A directory in the way: an error, and no temporary file left.
        let blocked = dir.path().join("sub");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("x"), b"keep").unwrap();
        let e = write_atomically(&blocked, b"svg").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // Nor is a symlink replaced, nor what it points to.
        let link = dir.path().join("link.svg");
        std::os::unix::fs::symlink(&out, &link).unwrap();
        assert!(write_atomically(&link, b"svg").is_err());
        assert_eq!(fs::read(&out).unwrap(), b"two");
        fs::remove_file(&link).unwrap();
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        let mut names = names;
        names.sort();
        assert_eq!(names, ["f.svg", "sub"]);
        // A missing directory.
        let err = write_atomically(&dir.path().join("no/such/f.svg"), b"svg").unwrap_err();
        assert!(err.to_string().contains("no/such/f.svg"), "{err}");
    }
}
