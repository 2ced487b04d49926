//! The shape of a client's state string, format `f4` (see
//! `crates/turnstile-redis/lua/states.lua`), for tests that read what Redis holds.

use std::collections::HashSet;

/// What is wrong with `v` as a state string of format `f4`, or `None` when it is one: a
/// header `0` or `c`, then one line or more `\n<alg>.<L>.<P>.<B>|<n>|<n>[|<n>]\t<name>`,
/// as many numbers as the algorithm stores (3 for the sliding window, id 6; 2 for the
/// others, ids 1 to 5), every number decimal digits, each name once. Checks the shape only,
/// not whether the numbers are a state some request leaves (the scripts check that).
pub fn f4_problem(v: &[u8]) -> Option<String> {
    let Ok(text) = std::str::from_utf8(v) else {
        return Some("not UTF-8".into());
    };
    let Some(body) = text.strip_prefix('0').or_else(|| text.strip_prefix('c')) else {
        return Some("no header".into());
    };
    let Some(lines) = body.strip_prefix('\n') else {
        return Some("no line".into());
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut names = HashSet::new();
    for line in lines.split('\n') {
        let Some((state, name)) = line.split_once('\t') else {
            return Some(format!("line {line:?}: no tab"));
        };
        let mut parts = state.split('|');
        let params: Vec<&str> = parts.next().unwrap_or("").split('.').collect();
        let numbers: Vec<&str> = parts.collect();
        if params.len() != 4 || !params.iter().all(|s| digits(s)) {
            return Some(format!("line {line:?}: parameters"));
        }
        let count = match params[0] {
            "1" | "2" | "3" | "4" | "5" => 2,
            "6" => 3,
            _ => return Some(format!("line {line:?}: algorithm")),
        };
        if numbers.len() != count || !numbers.iter().all(|s| digits(s)) {
            return Some(format!("line {line:?}: numbers"));
        }
        if name.is_empty() || !names.insert(name) {
            return Some(format!("line {line:?}: name"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::f4_problem;

    #[test]
    fn only_the_f4_shape_passes() {
        for ok in [
            "0\n4.5.1000.5|1700000000000|3\tw",
            "c\n1.5.1000.5|1|0\tt\n6.5.1000.5|1|2|0\ts",
        ] {
            assert_eq!(f4_problem(ok.as_bytes()), None, "{ok:?}");
        }
        for bad in [
            &b""[..],
            b"0",
            b"x\n4.5.1000.5|1|3\tw",
            b"0\n4.5.1000.5|1|3 w",
            b"0\n4.5.1000|1|3\tw",
            b"0\n4.5.1000.5\tw",
            b"0\n4.5.1000.5|1|+3\tw",
            b"0\n4.5.1000.5|1|0|3\tw",
            b"0\n6.5.1000.5|1|0\tw",
            b"0\n7.5.1000.5|1|0\tw",
            b"0\n4.5.1000.5|1|3\t",
            b"0\n4.5.1000.5|1|3\tw\n4.5.1000.5|1|3\tw",
            b"0\n4.5.1000.5|1|3\tw\n",
            b"0\n4.5.1000.5|1|3\t\xff",
        ] {
            assert!(
                f4_problem(bad).is_some(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
