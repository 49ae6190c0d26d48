//! CPython's line tables: which source line an instruction of a code
//! object came from.
//!
//! 3.9's `co_lnotab` is (byte delta, signed line delta) pairs: an
//! instruction's line is the first line plus the line deltas of every
//! pair whose running byte offset has reached it. 3.10's `co_linetable`
//! is (byte length, signed line delta) pairs, each a range of bytes at
//! the running line (-128: no line), empty ranges only moving the line.
//!
//! 3.11+'s location tables (`co_linetable`) follow CPython's
//! `Objects/locations.md`: entries of one or more code units each, the
//! first byte `1 code(4) length-1(3)`, then per code:
//!
//! - 0–9: short form, the line unchanged (one byte of columns follows);
//! - 10–12: one-line form, the line moves by `code - 10` (two bytes follow);
//! - 13: no columns, the line moves by a signed varint;
//! - 14: long form, a signed varint line delta, then end line, start and
//!   end columns as varints;
//! - 15: no location.
//!
//! Varints are little-endian groups of six bits, 0x40 meaning more follow;
//! a signed one keeps its sign in bit 0.
//!
//! A hand-written parser: no crate reads this format.

/// The line of code unit `unit` (instruction offset / 2) of a code object
/// whose first line is `first_line`; None where the table gives none or
/// ends before it.
pub fn line_of(table: &[u8], first_line: u32, unit: u64) -> Option<u32> {
    let mut line = i64::from(first_line);
    let mut at = 0usize;
    let mut start = 0u64;
    while at < table.len() {
        let head = table[at];
        if head & 0x80 == 0 {
            // Not at an entry's first byte: a corrupt table.
            return None;
        }
        at += 1;
        let code = (head >> 3) & 0x0f;
        let units = u64::from(head & 0x07) + 1;
        let mut has_line = true;
        match code {
            0..=9 => at += 1,
            10..=12 => {
                line += i64::from(code) - 10;
                at += 2;
            }
            13 => line += signed_varint(table, &mut at)?,
            14 => {
                line += signed_varint(table, &mut at)?;
                for _ in 0..3 {
                    varint(table, &mut at)?;
                }
            }
            _ => has_line = false,
        }
        if unit < start + units {
            return has_line.then(|| u32::try_from(line).ok()).flatten();
        }
        start += units;
    }
    None
}

/// The line of byte offset `offset` of a 3.9 code object (CPython's
/// `PyCode_Addr2Line`).
pub fn line_of_lnotab(table: &[u8], first_line: u32, offset: u64) -> u32 {
    let mut line = i64::from(first_line);
    let mut at = 0u64;
    for pair in table.chunks_exact(2) {
        at += u64::from(pair[0]);
        if at > offset {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    u32::try_from(line).unwrap_or(first_line)
}

/// The line of byte offset `offset` of a 3.10 code object (CPython's
/// `_PyCode_CheckLineNumber`); None where the table gives none or ends
/// before it.
pub fn line_of_linetable310(table: &[u8], first_line: u32, offset: u64) -> Option<u32> {
    let mut line = i64::from(first_line);
    let mut end = 0u64;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let has_line = delta != -128;
        if has_line {
            line += i64::from(delta);
        }
        if start <= offset && offset < end {
            return has_line.then(|| u32::try_from(line).ok()).flatten();
        }
    }
    None
}

fn varint(table: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *table.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x3f).checked_shl(shift)?;
        if byte & 0x40 == 0 {
            return Some(value);
        }
        shift += 6;
    }
}

fn signed_varint(table: &[u8], at: &mut usize) -> Option<i64> {
    let value = varint(table, at)?;
    let magnitude = i64::try_from(value >> 1).ok()?;
    Some(if value & 1 != 0 {
        -magnitude
    } else {
        magnitude
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables of this function, as CPython 3.12.1 and 3.11.2 compiled
    /// it (`f.__code__.co_linetable`), with `co_firstlineno` 1, against
    /// the line of every code unit from `co_positions()`:
    ///
    /// ```python
    /// def f(n):
    ///     total = 0
    ///     for i in range(n):
    ///         total += i * i
    ///     return total
    /// ```
    #[test]
    fn lines_agree_with_cpython() {
        for (table, lines) in [(TABLE_312, LINES_312), (TABLE_311, LINES_311)] {
            for (unit, &want) in lines.iter().enumerate() {
                assert_eq!(line_of(table, 1, unit as u64), Some(want), "unit {unit}");
            }
            assert_eq!(line_of(table, 1, lines.len() as u64), None);
        }
    }

    /// `f` above and `g` (a loop, an expression over two lines, a gap of
    /// 200 lines, `try`/`finally`) as 3.9.18 and 3.10.13 compiled them,
    /// against the line of every instruction: 3.10's from `co_lines()`,
    /// 3.9's from `dis.findlinestarts`.
    #[test]
    fn older_tables_agree_with_cpython() {
        for (table, lines) in [(LNOTAB_F, LINES_F_39), (LNOTAB_G, LINES_G_39)] {
            for (unit, &want) in lines.iter().enumerate() {
                assert_eq!(
                    line_of_lnotab(table, 1, 2 * unit as u64),
                    want,
                    "3.9 {unit}"
                );
            }
        }
        for (table, lines) in [(LINETABLE_F, LINES_F_310), (LINETABLE_G, LINES_G_310)] {
            for (unit, &want) in lines.iter().enumerate() {
                let got = line_of_linetable310(table, 1, 2 * unit as u64);
                assert_eq!(got, Some(want), "3.10 {unit}");
            }
            assert_eq!(line_of_linetable310(table, 1, 2 * lines.len() as u64), None);
        }
        // -128: a range without a line.
        assert_eq!(line_of_linetable310(&[2, 1, 2, 0x80], 1, 2), None);
    }

    const LNOTAB_F: &[u8] = &[0, 1, 4, 1, 12, 1, 14, 1];
    const LINES_F_39: &[u32] = &[2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 5, 5];
    const LINETABLE_F: &[u8] = &[4, 1, 12, 1, 14, 1, 4, 1];
    const LINES_F_310: &[u32] = LINES_F_39;
    const LNOTAB_G: &[u8] = &[
        0, 1, 4, 1, 4, 1, 4, 1, 2, 255, 6, 2, 10, 127, 0, 74, 2, 1, 4, 2, 4, 254, 2, 2,
    ];
    const LINES_G_39: &[u32] = &[
        2, 2, 3, 3, 4, 4, 5, 4, 4, 4, 6, 6, 6, 6, 6, 207, 208, 208, 210, 210, 208, 210, 210, 210,
        210, 210,
    ];
    const LINETABLE_G: &[u8] = &[
        4, 1, 4, 1, 4, 1, 2, 1, 6, 255, 8, 2, 4, 253, 0, 127, 2, 77, 4, 1, 12, 2,
    ];
    const LINES_G_310: &[u32] = &[
        2, 2, 3, 3, 4, 4, 5, 4, 4, 4, 6, 6, 6, 6, 3, 3, 207, 208, 208, 210, 210, 210, 210, 210, 210,
    ];

    #[test]
    fn varints() {
        let mut at = 0;
        assert_eq!(varint(&[0x45, 0x01], &mut at), Some(5 | (1 << 6)));
        at = 0;
        assert_eq!(signed_varint(&[0x03], &mut at), Some(-1));
        assert_eq!(line_of(&[0x05], 1, 0), None, "not an entry's first byte");
    }

    const TABLE_312: &[u8] = &[
        128, 0, 216, 12, 13, 128, 69, 220, 13, 18, 144, 49, 139, 88, 242, 0, 1, 5, 23, 136, 1, 216,
        8, 13, 144, 17, 144, 81, 145, 21, 137, 14, 137, 5, 240, 3, 1, 5, 23, 224, 11, 16, 128, 76,
    ];
    const LINES_312: &[u32] = &[
        1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 5, 5,
    ];
    const TABLE_311: &[u8] = &[
        128, 0, 216, 12, 13, 128, 69, 221, 13, 18, 144, 49, 137, 88, 140, 88, 240, 0, 1, 5, 23,
        240, 0, 1, 5, 23, 136, 1, 216, 8, 13, 144, 17, 144, 81, 145, 21, 137, 14, 136, 5, 136, 5,
        216, 11, 16, 128, 76,
    ];
    const LINES_311: &[u32] = &[
        1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5,
    ];
}
