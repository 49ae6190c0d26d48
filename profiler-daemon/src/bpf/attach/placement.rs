//! Where to put a uprobe on a function's entry so that it costs least.
//!
//! At a uprobe the kernel either emulates the probed instruction (x86:
//! relative jumps, calls and conditional jumps, and `push reg`) or copies it
//! out of line and single-steps it, which costs two more traps. Measured on
//! the development VM: about 0.4 µs per call on glibc's `malloc` (first
//! instruction `push %r12`, emulated) against about 14 µs on glibc's `free`
//! (first instruction `test %rdi,%rdi`, single-stepped).
//!
//! The probe may move from the entry to a later instruction when nothing is
//! lost by it:
//! - every call executes it: it lies in the straight-line run of
//!   instructions from the entry, before any jump, call or return, and no
//!   branch in the function lands inside that run (a loop back into it would
//!   run the probe twice, or not at all);
//! - the probe still sees what an entry probe sees: no instruction before it
//!   writes an argument register or the stack pointer, so the arguments are
//!   in their registers and the return address is at `[rsp]`.
//!
//! glibc's `free` starts `test %rdi,%rdi; je ...`: `test` only sets flags, so
//! the probe goes on the `je`, which every call executes and the kernel
//! emulates.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, OpAccess,
    Register,
};

/// Instructions of the entry run looked at; allocator entries decide within
/// a few.
const MAX_PREFIX: usize = 8;

/// Registers whose values an entry probe reads: the six argument registers
/// of the System V ABI and the stack pointer (the return address).
const ENTRY_STATE: [Register; 7] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
    Register::RSP,
];

/// Where to attach, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Bytes from the function's entry.
    pub offset: u64,
    /// Whether the kernel emulates the instruction there.
    pub emulated: bool,
}

/// Whether the x86 uprobe code emulates `insn` rather than single-stepping
/// it (arch/x86/kernel/uprobes.c: branch and push emulation).
pub fn kernel_emulates(insn: &Instruction) -> bool {
    match insn.code() {
        Code::Push_r64 | Code::Push_r16 => true,
        Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64 => true,
        _ => insn.is_jcc_short_or_near(),
    }
}

/// Chooses the probe offset for the function whose machine code is `code`
/// (the whole function, so that branches into its entry run are seen),
/// loaded at `address`.
pub fn choose(code: &[u8], address: u64) -> Placement {
    let entry = Placement {
        offset: 0,
        emulated: false,
    };
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let instructions: Vec<Instruction> = decoder.iter().collect();
    let Some(first) = instructions.first() else {
        return entry;
    };
    if first.is_invalid() {
        return entry;
    }
    if kernel_emulates(first) {
        return Placement {
            offset: 0,
            emulated: true,
        };
    }
    // Saturating and wrapping below: `address` comes from a file's symbol
    // table and may be anything; the decoder's ip wraps past u64::MAX.
    let end = address.saturating_add(code.len() as u64);
    let targets: Vec<u64> = instructions
        .iter()
        .filter(|i| {
            matches!(
                i.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
            )
        })
        .map(|i| i.near_branch_target())
        .filter(|&t| t > address && t < end)
        .collect();

    let mut info = InstructionInfoFactory::new();
    for (index, insn) in instructions.iter().enumerate().take(MAX_PREFIX) {
        if insn.is_invalid() {
            break;
        }
        if index > 0 {
            // A branch landing at or before this instruction (after the
            // entry) would make it run a different number of times than
            // the function is called.
            if targets.iter().any(|&t| t <= insn.ip()) {
                break;
            }
            if kernel_emulates(insn) {
                return Placement {
                    offset: insn.ip().wrapping_sub(address),
                    emulated: true,
                };
            }
        }
        // Control may leave the straight-line run after this instruction.
        if insn.flow_control() != FlowControl::Next {
            break;
        }
        // Past this instruction the entry state could be changed.
        let writes_entry_state = info.info(insn).used_registers().iter().any(|used| {
            matches!(
                used.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            ) && ENTRY_STATE.contains(&used.register().full_register())
        });
        if writes_entry_state {
            break;
        }
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSection, ObjectSymbol};

    const AT: u64 = 0x1000;

    #[test]
    fn emulated_entry_stays() {
        // push %r12; push %rbp
        assert_eq!(
            choose(&[0x41, 0x54, 0x55], AT),
            Placement {
                offset: 0,
                emulated: true
            }
        );
    }

    #[test]
    fn moves_past_a_flags_only_test_to_the_jump() {
        // test %rdi,%rdi; je +0x10; push %rbp; ret; (padding)
        let code = [0x48, 0x85, 0xff, 0x74, 0x10, 0x55, 0xc3];
        assert_eq!(
            choose(&code, AT),
            Placement {
                offset: 3,
                emulated: true
            }
        );
    }

    #[test]
    fn stays_when_an_argument_register_changes_first() {
        // mov %rax,%rdi; je +0x10
        let code = [0x48, 0x89, 0xc7, 0x74, 0x10];
        assert_eq!(choose(&code, AT).offset, 0);
        // sub $0x18,%rsp; push %rbx: the return address is no longer at [rsp]
        let code = [0x48, 0x83, 0xec, 0x18, 0x53];
        assert_eq!(choose(&code, AT).offset, 0);
    }

    #[test]
    fn stays_when_a_branch_lands_inside_the_entry_run() {
        // 0: test %rdi,%rdi; 3: je +2 (to 7); 5: jmp -4 (to 3)... a loop to 3
        let code = [0x48, 0x85, 0xff, 0x74, 0x02, 0xeb, 0xfc, 0xc3];
        assert_eq!(choose(&code, AT).offset, 0);
    }

    mod properties {
        use super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            /// Any bytes at any address: the probe stays on an instruction
            /// boundary inside the code, or at the entry.
            #[test]
            fn placement_is_inside_the_code(
                code in vec(any::<u8>(), 0..64),
                address in prop_oneof![Just(u64::MAX - 3), Just(0u64), any::<u64>()],
            ) {
                let placed = choose(&code, address);
                prop_assert!(placed.offset == 0 || placed.offset < code.len() as u64, "{:?}", placed);
                if placed.offset > 0 {
                    // The same bytes decoded from the entry reach that offset.
                    let mut decoder = Decoder::with_ip(64, &code, 0, DecoderOptions::NONE);
                    let starts: Vec<u64> = decoder.iter().map(|i| i.ip()).collect();
                    prop_assert!(starts.contains(&placed.offset), "{:?}", placed);
                }
            }
        }
    }

    /// glibc's own allocator entries on this machine.
    #[test]
    fn glibc_free_and_malloc() {
        let Ok(data) = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6") else {
            return; // not a Debian-like x86_64 system
        };
        let file = object::File::parse(&*data).expect("libc parses");
        let text = file.section_by_name(".text").expect(".text");
        let text_data = text.data().expect("text data");
        let code_of = |name: &str| {
            let sym = file
                .dynamic_symbols()
                .find(|s| s.name() == Ok(name))
                .unwrap_or_else(|| panic!("{name} in libc"));
            let start = (sym.address() - text.address()) as usize;
            (
                &text_data[start..start + sym.size() as usize],
                sym.address(),
            )
        };
        let (free, at) = code_of("free");
        let placed = choose(free, at);
        // Debian's glibc 2.36 starts free with `test %rdi,%rdi; je`.
        if free.starts_with(&[0x48, 0x85, 0xff]) {
            assert_eq!(
                placed,
                Placement {
                    offset: 3,
                    emulated: true
                }
            );
        }
        let (malloc, at) = code_of("malloc");
        let placed = choose(malloc, at);
        assert!(placed.emulated, "malloc: {placed:?}");
    }
}
