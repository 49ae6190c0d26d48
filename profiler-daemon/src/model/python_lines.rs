//! CPython 3.11+ location tables (`co_linetable`): which source line an
//! instruction of a code object came from. The format is CPython's
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
