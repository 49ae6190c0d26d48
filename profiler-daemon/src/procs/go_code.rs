//! Where the Go runtime keeps variables the daemon reads, in a binary
//! without a symbol table (`-ldflags='-s -w'`), read out of the runtime's
//! own code: the functions are found through the pclntab, which stripping
//! keeps, and decoded (iced-x86) for the RIP-relative loads of the
//! variable. Each pattern is checked on go1.19 and go1.27 (`go tool
//! objdump`).

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, OpKind, Register};
use object::{Object, ObjectSection};

use crate::model::go_pclntab::Pclntab;

/// `runtime.allgs`: `runtime.forEachG` loads the slice's pointer and its
/// length, two adjacent words; the first such pair is the slice.
pub fn allgs(file: &object::File<'_>, table: &Pclntab<'_>) -> Option<u64> {
    let loads: Vec<u64> = decode(file, table, "runtime.forEachG")?
        .iter()
        .filter_map(rip_load)
        .collect();
    loads.iter().copied().find(|&at| loads.contains(&(at + 8)))
}

/// `runtime.MemProfileRate`: `runtime.profilealloc` loads it last before
/// it calls `runtime.fastexprand` with it (the sampling distance drawn
/// from the rate).
pub fn mem_profile_rate(file: &object::File<'_>, table: &Pclntab<'_>) -> Option<u64> {
    let (fastexprand, _) = table.function_named("runtime.fastexprand")?;
    let mut last = None;
    for instruction in decode(file, table, "runtime.profilealloc")? {
        if let Some(at) = rip_load(&instruction) {
            last = Some(at);
        }
        if instruction.flow_control() == FlowControl::Call
            && instruction.op0_kind() == OpKind::NearBranch64
            && instruction.near_branch64() == fastexprand
        {
            return last;
        }
    }
    None
}

/// The instructions of the function named `name`.
fn decode(file: &object::File<'_>, table: &Pclntab<'_>, name: &str) -> Option<Vec<Instruction>> {
    let (entry, size) = table.function_named(name)?;
    let code = code_of(file, entry, size)?;
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut out = Vec::new();
    while decoder.can_decode() {
        out.push(decoder.decode());
    }
    Some(out)
}

/// The address an 8-byte RIP-relative load (`MOVQ sym(SB), reg`) reads.
fn rip_load(instruction: &Instruction) -> Option<u64> {
    (instruction.code() == Code::Mov_r64_rm64
        && instruction.op1_kind() == OpKind::Memory
        && instruction.memory_base() == Register::RIP)
        .then(|| instruction.ip_rel_memory_address())
}

/// The bytes of the code at `address`, `size` long, from the file.
fn code_of<'d>(file: &object::File<'d>, address: u64, size: u64) -> Option<&'d [u8]> {
    file.sections().find_map(|section| {
        let start = section.address();
        if address < start || address + size > start + section.size() {
            return None;
        }
        let data = section.data().ok()?;
        let from = usize::try_from(address - start).ok()?;
        data.get(from..from + usize::try_from(size).ok()?)
    })
}
