//! The Go release that built a binary, from its build information
//! (`.go.buildinfo`, which stripping keeps): what the probe finders and
//! the process reader need to know of the runtime's layout.

/// The build information's header: magic, pointer size, flags.
const BUILDINFO_MAGIC: &[u8] = b"\xff Go buildinf:";
/// Flag: the version and module strings follow the header inline
/// (Go 1.18 and later).
const BUILDINFO_INLINE: u8 = 2;
/// Where the inline version string starts.
const BUILDINFO_STRINGS: usize = 32;

/// Whether `file` is Go code: it has Go's function table or build
/// information (the cheap test that most files fail).
pub fn is_go<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> bool {
    use object::Object;
    [".gopclntab", ".data.rel.ro.gopclntab", ".go.buildinfo"]
        .iter()
        .any(|name| file.section_by_name(name).is_some())
}

/// The minor number of the Go 1.x release that built `file`, from its
/// build information; None where it names none (not Go, or before 1.18).
pub fn go_release<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> Option<u32> {
    use object::{Object, ObjectSection};
    match go_version(file.section_by_name(".go.buildinfo")?.data().ok()?)? {
        (1, minor) => Some(minor),
        _ => None,
    }
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
}
