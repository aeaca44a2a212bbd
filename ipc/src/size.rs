//! Byte sizes for people: `512MiB`, `2GiB`, `1.5GB`, `4096`.

/// Parses a byte size. Binary units (`KiB`, `MiB`, `GiB`, `TiB`) are powers of 1024, decimal
/// ones (`KB`, `MB`, `GB`, `TB`) powers of 1000; `K`/`M`/`G`/`T` alone are binary; a bare
/// number (or `B`) is bytes. Case-insensitive, spaces allowed before the unit.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    if num.is_empty() {
        return Err(format!(
            "`{text}` is not a size: expected a number such as 512MiB or 2GiB"
        ));
    }
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "unknown size unit `{unit}` in `{text}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ));
        }
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("size `{text}` is too large"));
    }
    let f: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size: bad number `{num}`"))?;
    let bytes = f * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("size `{text}` is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes with a binary unit and two decimals (`1.50 GiB`); below 1 KiB, plain bytes.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_decimal_and_plain_sizes() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("2 gib"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("3GB"), Ok(3_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(parse_size("5XB").unwrap_err().contains("unknown size unit"));
        assert!(
            parse_size("99999999999TiB")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_size("1.2.3GiB").is_err());
    }

    #[test]
    fn formats_human_sizes() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(737_280), "720.00 KiB");
        assert_eq!(format_size(2 << 30), "2.00 GiB");
    }
}
