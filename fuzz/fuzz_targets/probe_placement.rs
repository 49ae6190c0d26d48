//! Any machine code at any address (the first 8 bytes): the probe goes at
//! the entry or on an instruction boundary inside the code.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((address, code)) = data.split_first_chunk::<8>() else {
        return;
    };
    let placed = profilerd::bpf::attach::placement::choose(code, u64::from_le_bytes(*address));
    assert!(placed.offset == 0 || placed.offset < code.len() as u64);
});
