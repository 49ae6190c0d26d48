//! Any bytes as a file that may hold an allocator: probe points inside the
//! file, or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(points)) = profilerd::bpf::attach::allocators::find_in(data) {
        assert_eq!(points.offsets.len(), points.cookies.len());
        for offset in points.offsets {
            assert!(offset < data.len() as u64, "{offset}");
        }
    }
});
