//! What the daemon tells the kernel about a Go process: that it is one (Go
//! keeps frame pointers and ships no `.eh_frame`, so the kernel walks its
//! stacks), the range of its code (for the words a frameless leaf's caller
//! may be in), and where its goroutines' pprof labels are, which depends
//! on the Go release that built it (read from the binary's build
//! information, `.go.buildinfo`, which stripping keeps).

use std::os::unix::fs::MetadataExt;

use object::{Object, ObjectSection};
use procfs::process::{MMPermissions, MMapPath, Process};
use profiler_common::{FpProcess, GoRuntime, go_labels_form};

/// `g.m`, the same in every release read.
const G_M: u16 = 48;
/// The build information's header: magic, pointer size, flags.
const BUILDINFO_MAGIC: &[u8] = b"\xff Go buildinf:";
/// Flag: the version and module strings follow the header inline
/// (Go 1.18 and later).
const BUILDINFO_INLINE: u8 = 2;
/// Where the inline version string starts.
const BUILDINFO_STRINGS: usize = 32;

/// The runtime layout of the Go executable process `tgid` runs: None when
/// it is not a Go executable; labels not read (`NONE`) for a release whose
/// layout is not known.
pub fn go_executable(tgid: u32) -> Option<GoRuntime> {
    let exe = std::fs::File::open(format!("/proc/{tgid}/exe")).ok()?;
    // Reads only the headers, the section names and the build information.
    let cache = object::ReadCache::new(exe);
    let file = object::File::parse(&cache).ok()?;
    let is_go = file
        .sections()
        .any(|s| matches!(s.name(), Ok(".gopclntab" | ".go.buildinfo")));
    if !is_go {
        return None;
    }
    let version = file
        .section_by_name(".go.buildinfo")
        .and_then(|section| section.data().ok())
        .and_then(go_version);
    Some(version.map_or_else(GoRuntime::default, |(_, minor)| runtime_layout(minor)))
}

/// The (major, minor) Go release in a `.go.buildinfo` section (Go 1.18
/// and later write it inline: a varint length, then `go1.N[.P]`).
pub fn go_version(data: &[u8]) -> Option<(u32, u32)> {
    if !data.starts_with(BUILDINFO_MAGIC) || data.get(15)? & BUILDINFO_INLINE == 0 {
        return None;
    }
    let mut at = BUILDINFO_STRINGS;
    let mut len = 0usize;
    for shift in (0..28).step_by(7) {
        let byte = *data.get(at)?;
        at += 1;
        len |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    let text = std::str::from_utf8(data.get(at..at.checked_add(len)?)?).ok()?;
    // "go1.21.5", "go1.22rc1", "devel go1.23-abc...": the first "go1.N".
    let rest = &text[text.find("go1.")? + 4..];
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((1, minor.parse().ok()?))
}

/// Where release 1.`minor` keeps a goroutine's labels: `m.curg` and
/// `g.labels` as the DWARF of a binary built by each of go1.19.8,
/// 1.21.13, 1.22.10, 1.23.9, 1.24.11, 1.25.5, 1.26.6 and 1.27.3 gives them
/// (1.18 and 1.20 as 1.19, as the OpenTelemetry profiler's table has
/// them); the labels changed from a map to a sorted list in Go 1.24.
pub fn runtime_layout(minor: u32) -> GoRuntime {
    let (m_curg, g_labels, labels_form) = match minor {
        18..=20 => (192, 360, go_labels_form::MAP),
        21..=22 => (192, 344, go_labels_form::MAP),
        23 => (192, 352, go_labels_form::MAP),
        24 => (192, 352, go_labels_form::LIST),
        25 => (184, 344, go_labels_form::LIST),
        26..=27 => (184, 352, go_labels_form::LIST),
        _ => return GoRuntime::default(),
    };
    GoRuntime {
        g_m: G_M,
        m_curg,
        g_labels,
        labels_form,
        _pad: [0; 3],
    }
}

/// The kernel's entry for Go process `tgid`: its code range (from its
/// first to its last executable mapping of the file /proc/PID/exe names;
/// empty when the mappings cannot be read) and its runtime layout.
pub fn fp_process(tgid: u32, go: GoRuntime) -> FpProcess {
    let (text_start, text_end) = executable_code_range(tgid).unwrap_or((0, 0));
    FpProcess {
        text_start,
        text_end,
        go,
    }
}

fn executable_code_range(tgid: u32) -> Option<(u64, u64)> {
    let exe = std::fs::metadata(format!("/proc/{tgid}/exe")).ok()?;
    let maps = Process::new(tgid as i32).ok()?.maps().ok()?;
    let (start, end) = maps
        .iter()
        .filter(|map| {
            map.perms.contains(MMPermissions::EXECUTE)
                && map.inode == exe.ino()
                && matches!(map.pathname, MMapPath::Path(_))
        })
        .fold((u64::MAX, 0), |(lo, hi), map| {
            (lo.min(map.address.0), hi.max(map.address.1))
        });
    (start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buildinfo(version: &str) -> Vec<u8> {
        let mut data = BUILDINFO_MAGIC.to_vec();
        data.push(8);
        data.push(BUILDINFO_INLINE);
        data.resize(BUILDINFO_STRINGS, 0);
        data.push(version.len() as u8);
        data.extend_from_slice(version.as_bytes());
        data.push(0);
        data
    }

    #[test]
    fn versions_are_read_from_the_build_information() {
        assert_eq!(go_version(&buildinfo("go1.19.8")), Some((1, 19)));
        assert_eq!(go_version(&buildinfo("go1.27.3")), Some((1, 27)));
        assert_eq!(go_version(&buildinfo("go1.22rc1")), Some((1, 22)));
        assert_eq!(go_version(&buildinfo("devel go1.28-abc")), Some((1, 28)));
        let mut old = buildinfo("go1.17");
        old[15] = 0;
        assert_eq!(go_version(&old), None, "pointer form, before Go 1.18");
        assert_eq!(go_version(b"not a buildinfo"), None);
    }

    #[test]
    fn layouts_change_with_the_release() {
        assert_eq!(runtime_layout(19).g_labels, 360);
        assert_eq!(runtime_layout(19).labels_form, go_labels_form::MAP);
        assert_eq!(runtime_layout(27).m_curg, 184);
        assert_eq!(runtime_layout(27).labels_form, go_labels_form::LIST);
        assert_eq!(
            runtime_layout(40),
            GoRuntime::default(),
            "unknown: not read"
        );
    }
}
