//! Kubernetes resource quantities (`1Gi`, `500M`, `1.5e9`) as exact whole bytes.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

// ---------------------------------------------------------------------------------------------
// Quantities

/// A Kubernetes resource quantity such as `1Gi`, `500M` or `1.5e9`, kept as written for the API
/// and also as whole bytes (rounded up, as Kubernetes does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity {
    text: String,
    bytes: u64,
}

impl Quantity {
    /// `{n}Gi`.
    pub fn gibibytes(n: u32) -> Self {
        Quantity {
            text: format!("{n}Gi"),
            bytes: u64::from(n) << 30,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// Accepts only positive sizes that fit in `u64` bytes: a storage request of zero is meaningless.
impl FromStr for Quantity {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let expected = "expected a positive Kubernetes quantity, e.g. \"1Gi\", \"500Mi\" or \"2G\"";
        let bytes = quantity_bytes(text)
            .ok_or_else(|| format!("{text:?} is not a quantity; {expected}"))?
            .filter(|&b| b > 0)
            .ok_or_else(|| format!("{text:?} is zero, negative or too large; {expected}"))?;
        Ok(Quantity {
            text: text.to_owned(),
            bytes,
        })
    }
}

/// `None`: malformed; `Some(None)`: well-formed but not a positive `u64`.
fn quantity_bytes(text: &str) -> Option<Option<u64>> {
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return None;
    }
    // (base, exponent): the value is number * base^exponent.
    let (base, exponent): (u128, i32) = match suffix {
        "" => (10, 0),
        "m" => (10, -3),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        "Ki" => (2, 10),
        "Mi" => (2, 20),
        "Gi" => (2, 30),
        "Ti" => (2, 40),
        "Pi" => (2, 50),
        "Ei" => (2, 60),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (10, exponent.parse().unwrap_or(i32::MAX))
        }
    };
    if negative {
        return Some(None);
    }
    Some(scaled_bytes(whole, fraction, base, exponent))
}

/// `whole.fraction * base^exponent`, rounded up, if it fits.
fn scaled_bytes(whole: &str, fraction: &str, base: u128, exponent: i32) -> Option<u64> {
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    let mantissa: u128 = digits.parse().ok()?;
    // The fraction's digits are part of the mantissa; divide their place value back out.
    let mut numerator = mantissa;
    let mut denominator = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let power = base.checked_pow(exponent.unsigned_abs())?;
    if exponent >= 0 {
        numerator = numerator.checked_mul(power)?;
    } else {
        denominator = denominator.checked_mul(power)?;
    }
    u64::try_from(numerator.div_ceil(denominator)).ok()
}

/// A quantity that may be zero, such as a quota's `status.used`, in whole units (bytes, or a
/// count), rounded up; `None` when it does not parse or is negative or too large.
pub fn amount(text: &str) -> Option<u64> {
    quantity_bytes(text).flatten()
}
