//! Exact decimal arithmetic for DynamoDB numbers: up to 38 significant
//! digits, exponents from -130 to 125. Sums are computed digit by digit,
//! never in floating point, and a result DynamoDB could not store is an
//! error rather than a rounded value.

use std::cmp::Ordering;
use std::fmt;

/// The most significant digits a DynamoDB number holds.
pub const MAX_DIGITS: usize = 38;

/// A decimal: `digits` (most significant first, no leading zeros; empty
/// for zero) times ten to the power `exponent`, negative when `negative`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decimal {
    negative: bool,
    digits: Vec<u8>,
    exponent: i32,
}

impl Decimal {
    /// Zero.
    pub fn zero() -> Decimal {
        Decimal {
            negative: false,
            digits: Vec::new(),
            exponent: 0,
        }
    }

    /// Parses a number as DynamoDB writes it (`-12.50`, `1E+3`, `.5`).
    pub fn parse(text: &str) -> Option<Decimal> {
        let text = text.trim();
        let (negative, rest) = match text.as_bytes().first()? {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let (mantissa, exponent) = match rest.find(['e', 'E']) {
            Some(at) => (&rest[..at], rest[at + 1..].parse::<i32>().ok()?),
            None => (rest, 0),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        if !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let digits: Vec<u8> = whole
            .bytes()
            .chain(fraction.bytes())
            .map(|b| b - b'0')
            .collect();
        let exponent = exponent.checked_sub(i32::try_from(fraction.len()).ok()?)?;
        Some(
            Decimal {
                negative,
                digits,
                exponent,
            }
            .normalized(),
        )
    }

    fn normalized(mut self) -> Decimal {
        let leading = self.digits.iter().take_while(|&&d| d == 0).count();
        self.digits.drain(..leading);
        while self.digits.last() == Some(&0) {
            self.digits.pop();
            self.exponent += 1;
        }
        if self.digits.is_empty() {
            return Decimal::zero();
        }
        self
    }

    /// Whether DynamoDB can store it: at most 38 significant digits, a
    /// magnitude from 1E-130 to below 1E+126.
    pub fn storable(&self) -> bool {
        if self.digits.is_empty() {
            return true;
        }
        let magnitude = self.exponent + self.digits.len() as i32 - 1;
        self.digits.len() <= MAX_DIGITS && (-130..=125).contains(&magnitude)
    }

    /// The digits scaled to `exponent` (which must not exceed ours).
    fn scaled(&self, exponent: i32) -> Vec<u8> {
        let mut digits = self.digits.clone();
        digits.extend(std::iter::repeat_n(0, (self.exponent - exponent) as usize));
        digits
    }

    /// The sum of two decimals, exact.
    pub fn add(&self, other: &Decimal) -> Decimal {
        if self.digits.is_empty() {
            return other.clone();
        }
        if other.digits.is_empty() {
            return self.clone();
        }
        let exponent = self.exponent.min(other.exponent);
        let a = self.scaled(exponent);
        let b = other.scaled(exponent);
        let (negative, digits) = if self.negative == other.negative {
            (self.negative, add_magnitudes(&a, &b))
        } else {
            match compare_magnitudes(&a, &b) {
                Ordering::Equal => return Decimal::zero(),
                Ordering::Greater => (self.negative, sub_magnitudes(&a, &b)),
                Ordering::Less => (other.negative, sub_magnitudes(&b, &a)),
            }
        };
        Decimal {
            negative,
            digits,
            exponent,
        }
        .normalized()
    }

    /// Orders two decimals by value.
    pub fn compare(&self, other: &Decimal) -> Ordering {
        let sign = |d: &Decimal| match (d.digits.is_empty(), d.negative) {
            (true, _) => 0,
            (false, true) => -1,
            (false, false) => 1,
        };
        match sign(self).cmp(&sign(other)) {
            Ordering::Equal => {}
            unequal => return unequal,
        }
        if self.digits.is_empty() {
            return Ordering::Equal;
        }
        let exponent = self.exponent.min(other.exponent);
        let magnitude = compare_magnitudes(&self.scaled(exponent), &other.scaled(exponent));
        if self.negative {
            magnitude.reverse()
        } else {
            magnitude
        }
    }
}

impl fmt::Display for Decimal {
    /// Plain notation when it is short (`-12.5`, `1500`), else `1.5E+40`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.digits.is_empty() {
            return f.write_str("0");
        }
        if self.negative {
            f.write_str("-")?;
        }
        let text: String = self.digits.iter().map(|d| char::from(b'0' + d)).collect();
        let n = self.digits.len() as i32;
        if (0..=20).contains(&self.exponent) && n + self.exponent <= MAX_DIGITS as i32 {
            write!(f, "{text}{}", "0".repeat(self.exponent as usize))
        } else if self.exponent < 0 && -self.exponent < n {
            let split = (n + self.exponent) as usize;
            write!(f, "{}.{}", &text[..split], &text[split..])
        } else if self.exponent < 0 && -self.exponent - n <= 20 {
            write!(f, "0.{}{text}", "0".repeat((-self.exponent - n) as usize))
        } else {
            let magnitude = self.exponent + n - 1;
            let (first, rest) = text.split_at(1);
            let rest = if rest.is_empty() {
                String::new()
            } else {
                format!(".{rest}")
            };
            write!(f, "{first}{rest}E{magnitude:+}")
        }
    }
}

fn compare_magnitudes(a: &[u8], b: &[u8]) -> Ordering {
    let a = &a[a.iter().take_while(|&&d| d == 0).count()..];
    let b = &b[b.iter().take_while(|&&d| d == 0).count()..];
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

fn add_magnitudes(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len().max(b.len()) + 1);
    let (mut i, mut j, mut carry) = (a.len(), b.len(), 0u8);
    while i > 0 || j > 0 || carry > 0 {
        let mut sum = carry;
        if i > 0 {
            i -= 1;
            sum += a[i];
        }
        if j > 0 {
            j -= 1;
            sum += b[j];
        }
        out.push(sum % 10);
        carry = sum / 10;
    }
    out.reverse();
    out
}

/// `a - b` for `a >= b`.
fn sub_magnitudes(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len());
    let (mut j, mut borrow) = (b.len(), 0i8);
    for i in (0..a.len()).rev() {
        let mut digit = a[i] as i8 - borrow;
        if j > 0 {
            j -= 1;
            digit -= b[j] as i8;
        }
        borrow = i8::from(digit < 0);
        out.push((digit + 10 * borrow) as u8);
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(text: &str) -> Decimal {
        Decimal::parse(text).unwrap_or_else(|| panic!("{text} parses"))
    }

    #[test]
    fn sums_are_exact_where_floating_point_is_not() {
        assert_eq!(d("0.1").add(&d("0.2")).to_string(), "0.3");
        assert_eq!(d("12.50").add(&d("-2.5")).to_string(), "10");
        assert_eq!(d("-3").add(&d("1")).to_string(), "-2");
        assert_eq!(d("5").add(&d("-5")).to_string(), "0");
        // 38 nines plus one needs 39 digits: DynamoDB cannot store it.
        let nines = "9".repeat(38);
        let sum = d(&nines).add(&d("1"));
        assert_eq!(sum.to_string(), "1E+38");
        assert!(sum.storable());
        let over = d(&nines).add(&d("0.1"));
        assert!(!over.storable(), "{over} has 39 significant digits");
    }

    #[test]
    fn parses_what_dynamodb_writes() {
        assert_eq!(d("1E+3").to_string(), "1000");
        assert_eq!(d(".5").to_string(), "0.5");
        assert_eq!(d("-0.00120").to_string(), "-0.0012");
        assert_eq!(d("1e-130").to_string(), "1E-130");
        assert_eq!(d("-0").to_string(), "0");
        for bad in ["", "-", ".", "1.2.3", "abc", "1e", "0x10", "1 2"] {
            assert!(Decimal::parse(bad).is_none(), "{bad:?} must not parse");
        }
    }

    #[test]
    fn orders_by_value() {
        assert_eq!(d("10").compare(&d("9")), Ordering::Greater);
        assert_eq!(d("-10").compare(&d("-9")), Ordering::Less);
        assert_eq!(d("1.50").compare(&d("1.5")), Ordering::Equal);
        assert_eq!(d("-1").compare(&d("0")), Ordering::Less);
        assert_eq!(d("1E+3").compare(&d("999.9")), Ordering::Greater);
    }
}
