//! Any text as a /proc/PID/cgroup path: the labels it yields have their
//! documented forms.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let facts = profilerd::procs::environment::parse_cgroup_path(path);
    if let Some(id) = facts.container_id {
        assert!(id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    if let Some(unit) = facts.systemd_unit {
        assert!(unit.ends_with(".service") && !unit.contains('/'));
    }
    if let Some(uid) = facts.pod_uid {
        assert!(uid.len() == 32 || uid.len() == 36, "{uid}");
    }
});
