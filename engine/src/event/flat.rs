//! The common case without serde: one flat object whose strings have no escapes and whose
//! numbers are integers. Anything else (escapes, floats, nesting, `null`, duplicate fields,
//! trailing bytes, any doubt) returns `None` and goes through serde, so both paths give the
//! same answer (property-tested in the event module through `parse_event_bytes` and
//! `EventParser`).

use std::borrow::Cow;

use super::{RawEvent, Scalar};

struct Cursor<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// The next byte that is not JSON whitespace, consumed.
    #[inline(always)]
    fn next(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        // Everything JSON treats as whitespace is at most a space.
        if byte > b' ' {
            Some(byte)
        } else {
            self.after_whitespace(byte)
        }
    }

    #[cold]
    fn after_whitespace(&mut self, mut byte: u8) -> Option<u8> {
        while matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            byte = *self.bytes.get(self.at)?;
            self.at += 1;
        }
        Some(byte)
    }

    #[inline(always)]
    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    /// The rest of a string whose opening quote was just read: no escapes or control
    /// characters, in one pass.
    #[inline(always)]
    fn string_rest(&mut self) -> Option<&'a str> {
        let start = self.at;
        let end = start + string_end(self.bytes.get(start..)?)?;
        if self.bytes[end] != b'"' {
            return None;
        }
        self.at = end + 1;
        // Both ends sit next to an ASCII quote, so they are character boundaries.
        self.text.get(start..end)
    }

    /// The name of a field whose opening quote was just read. The six names an event
    /// has are compared in place, a machine word at a time with their closing quote (so
    /// `"keys"` is not `"key"`); any other name is read as a string.
    #[inline(always)]
    fn field(&mut self) -> Option<Field> {
        if let Some(head) = self.bytes.get(self.at..).and_then(<[u8]>::first_chunk::<8>) {
            let word = u64::from_le_bytes(*head);
            let rest = &self.bytes[self.at + 8..];
            let known = if word == EVENT_TI && rest.starts_with(b"me\"") {
                Some((Field::EventTime, 11))
            } else if first_bytes(word, 7) == METRIC {
                Some((Field::Metric, 7))
            } else if first_bytes(word, 6) == SCOPE {
                Some((Field::Scope, 6))
            } else if first_bytes(word, 4) == KEY {
                Some((Field::Key, 4))
            } else if word == EVENT_ID && rest.first() == Some(&b'"') {
                Some((Field::EventId, 9))
            } else if first_bytes(word, 5) == COST {
                Some((Field::Cost, 5))
            } else {
                None
            };
            if let Some((field, len)) = known {
                self.at += len;
                return Some(field);
            }
        }
        // Another name, or one too close to the end for a word: read it whole.
        Some(match self.string_rest()? {
            "event_time" => Field::EventTime,
            "metric" => Field::Metric,
            "scope" => Field::Scope,
            "key" => Field::Key,
            "event_id" => Field::EventId,
            "cost" => Field::Cost,
            _ => Field::Other,
        })
    }

    /// The integer whose first byte was just read.
    #[inline(always)]
    fn integer(&mut self, first: u8) -> Option<Scalar<'a>> {
        let (value, end) = integer(self.bytes, self.at - 1, first)?;
        self.at = end;
        Some(value)
    }

    /// Skips a value of a field nobody reads, if it is simple.
    fn skip_value(&mut self) -> Option<()> {
        match self.next()? {
            b'"' => self.string_rest().map(|_| ()),
            first @ (b't' | b'f' | b'n') => {
                let rest = &self.bytes[self.at - 1..];
                let word: &[u8] = match first {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                rest.starts_with(word).then(|| self.at += word.len() - 1)
            }
            first => self.integer(first).map(|_| ()),
        }
    }
}

/// An integer as serde_json reads it, starting at `at` (where `first` is): negative ones
/// signed, others unsigned, with where it ends. Anything serde reads otherwise (past 19
/// digits, where u64 overflows and serde reads a float; `-0`, also a float to serde) is
/// left to serde.
#[inline(always)]
fn integer(bytes: &[u8], at: usize, first: u8) -> Option<(Scalar<'static>, usize)> {
    let negative = first == b'-';
    let from = if negative { at + 1 } else { at };
    let mut end = from;
    // Cannot wrap: more than 19 digits are refused below.
    let mut magnitude: u64 = 0;
    while let Some(eight) = bytes.get(end..).and_then(<[u8]>::first_chunk::<8>) {
        let (count, value) = leading_digits(u64::from_le_bytes(*eight));
        magnitude = magnitude
            .wrapping_mul(POWERS_OF_TEN[count])
            .wrapping_add(value);
        end += count;
        if count < 8 {
            break;
        }
    }
    // Digits in the last seven bytes of the input (none if the loop stopped at a non-digit).
    while let Some(digit @ b'0'..=b'9') = bytes.get(end) {
        magnitude = magnitude
            .wrapping_mul(10)
            .wrapping_add(u64::from(digit - b'0'));
        end += 1;
    }
    let digits = end - from;
    let leading_zero = digits > 1 && bytes[from] == b'0';
    if digits == 0 || digits > 19 || leading_zero || (negative && magnitude == 0) {
        return None;
    }
    if matches!(bytes.get(end), Some(b'.' | b'e' | b'E')) {
        return None;
    }
    let value = if negative {
        Scalar::Signed(0i64.checked_sub_unsigned(magnitude)?)
    } else {
        Scalar::Unsigned(magnitude)
    };
    Some((value, end))
}

const POWERS_OF_TEN: [u64; 9] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
];

/// How many of the eight bytes of a little-endian word (the first in the lowest byte) are
/// ASCII digits before the first that is not, and their value: a millisecond timestamp is
/// read this way in two words, with a few multiplications instead of a loop per digit.
#[inline(always)]
pub(super) fn leading_digits(word: u64) -> (usize, u64) {
    const NIBBLES: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    // A digit's high nibble is 3, and stays 3 when 6 is added to it. Digits cannot carry
    // into the next byte, so the lowest byte that fails is the first non-digit (bytes above
    // it may be misjudged, and are not used).
    let nibbles = (word & NIBBLES) | ((word.wrapping_add(0x0606_0606_0606_0606) & NIBBLES) >> 4);
    let others = nibbles ^ 0x3333_3333_3333_3333;
    let count = if others == 0 {
        8
    } else {
        others.trailing_zeros() as usize / 8
    };
    if count == 0 {
        return (0, 0);
    }
    // The digits moved to the top bytes with '0's below them: the same number, eight digits.
    let digits = if count == 8 {
        word
    } else {
        (word << (8 * (8 - count))) | (ZEROS >> (8 * count))
    };
    let ones = digits - ZEROS;
    // Pairs, then fours, then all eight; no lane can carry into the next.
    let pairs = (ones * 10 + (ones >> 8)) & 0x00FF_00FF_00FF_00FF;
    let fours = (pairs * 100 + (pairs >> 16)) & 0x0000_FFFF_0000_FFFF;
    (count, (fours * 10_000 + (fours >> 32)) & 0xFFFF_FFFF)
}

/// The fields an event has; any other is skipped.
#[derive(Clone, Copy)]
pub(super) enum Field {
    EventId,
    EventTime,
    Cost,
    Metric,
    Scope,
    Key,
    Other,
}

/// Little-endian word of a name's first eight bytes (with its closing quote if shorter).
const fn word(name: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let mut i = 0;
    while i < name.len() && i < 8 {
        bytes[i] = name[i];
        i += 1;
    }
    u64::from_le_bytes(bytes)
}

/// The first `n` bytes of a little-endian word.
const fn first_bytes(word: u64, n: u32) -> u64 {
    word & (u64::MAX >> (64 - 8 * n))
}

const EVENT_TI: u64 = word(b"event_ti");
const EVENT_ID: u64 = word(b"event_id");
const METRIC: u64 = word(b"metric\"");
const SCOPE: u64 = word(b"scope\"");
const KEY: u64 = word(b"key\"");
const COST: u64 = word(b"cost\"");

/// Position of the first `"`, `\\` or control character: eight bytes at a time, since
/// this scan is most of the parser's work.
#[inline(always)]
pub(super) fn string_end(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    // High bit of each byte below `n` (n <= 128). Borrows can mark bytes above the first
    // match, never below it, so the lowest marked byte is the first match.
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let hits = |x: u64| {
        below(x ^ (ONES * u64::from(b'"')), 1)
            | below(x ^ (ONES * u64::from(b'\\')), 1)
            | below(x, 0x20)
    };
    let mut words = bytes.chunks_exact(8);
    for (i, word) in (&mut words).enumerate() {
        let mut le = [0u8; 8];
        le.copy_from_slice(word);
        let found = hits(u64::from_le_bytes(le));
        if found != 0 {
            return Some(i * 8 + found.trailing_zeros() as usize / 8);
        }
    }
    if words.remainder().is_empty() {
        return None;
    }
    // The last eight bytes as one word: its low bytes were checked already (or, for a short
    // input, are padding that matches nothing), so they hold no hits and cause no borrows.
    let last = match bytes.last_chunk::<8>() {
        Some(last) => *last,
        None => {
            let mut padded = [b'a'; 8];
            padded[8 - bytes.len()..].copy_from_slice(bytes);
            padded
        }
    };
    let found = hits(u64::from_le_bytes(last));
    (found != 0).then(|| bytes.len() + found.trailing_zeros() as usize / 8 - 8)
}

/// Bytes as text, checked for UTF-8 (ASCII quickly); text that is not UTF-8 is left to
/// serde, which names the error. [`scan`] checks the whole payload at once, which is
/// cheaper than one check per string.
#[inline(always)]
#[allow(unsafe_code)]
fn utf8(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: every byte is below 0x80, and ASCII bytes are valid UTF-8 on their own.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

/// What a value of a read field is: the text of a string (between its quotes) or an integer.
#[inline(always)]
pub(super) fn scan<'a>(bytes: &'a [u8], raw: &mut RawEvent<'a>) -> Option<()> {
    let text = utf8(bytes)?;
    let mut c = Cursor { text, bytes, at: 0 };
    c.expect(b'{')?;
    let mut next = c.next()?;
    if next != b'}' {
        loop {
            if next != b'"' {
                return None;
            }
            let field = c.field()?;
            c.expect(b':')?;
            if let Field::Other = field {
                c.skip_value()?;
            } else {
                let first = c.next()?;
                let value = if first == b'"' {
                    Scalar::Text(Cow::Borrowed(c.string_rest()?))
                } else {
                    c.integer(first)?
                };
                if raw.has(field) {
                    // A repeated field is an error to serde: let it say so.
                    return None;
                }
                raw.put(field, value)?;
            }
            match c.next()? {
                b',' => next = c.next()?,
                b'}' => break,
                _ => return None,
            }
        }
    }
    // Only whitespace may follow.
    c.next().is_none().then_some(())
}
