//! Whether a minimal rootfs's interpreter is older than the host's: the
//! minimal flavour copies the host's Python at build time and records the
//! Debian packages it came from in its manifest; a later security update of
//! the host's package does not reach the copy (issue 19). The comparison is
//! Debian's own version order (deb-version(7)), so `3.11.2-6+deb12u5` is
//! older than `3.11.2-6+deb12u9`.

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// One package the rootfs holds an older version of than the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stale {
    pub package: String,
    pub rootfs: String,
    pub host: String,
}

/// Packages of `recorded` (the manifest's) that `host` has in a newer
/// version. A package the host no longer has is not stale: nothing newer
/// exists to copy.
pub(crate) fn stale(recorded: &BTreeMap<String, String>, host: &BTreeMap<String, String>) -> Vec<Stale> {
    recorded
        .iter()
        .filter_map(|(name, old)| {
            let new = host.get(name)?;
            (compare(old, new) == Ordering::Less).then(|| Stale { package: name.clone(), rootfs: old.clone(), host: new.clone() })
        })
        .collect()
}

/// Debian version order: epoch, then upstream version, then revision.
pub(crate) fn compare(a: &str, b: &str) -> Ordering {
    let (ea, ua, ra) = split(a);
    let (eb, ub, rb) = split(b);
    ea.cmp(&eb).then_with(|| verrevcmp(ua, ub)).then_with(|| verrevcmp(ra, rb))
}

fn split(v: &str) -> (u64, &str, &str) {
    let (epoch, rest) = match v.split_once(':') {
        Some((e, r)) if e.chars().all(|c| c.is_ascii_digit()) => (e.parse().unwrap_or(0), r),
        _ => (0, v),
    };
    match rest.rsplit_once('-') {
        Some((up, rev)) => (epoch, up, rev),
        None => (epoch, rest, ""),
    }
}

/// The weight of a non-digit character: `~` before everything (even the
/// end), the end next, then letters, then other characters.
fn order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(b'~') => -1,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(c) => i32::from(c) + 256,
    }
}

/// dpkg's `verrevcmp`: alternating non-digit and digit runs.
fn verrevcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        while (i < a.len() && !a[i].is_ascii_digit()) || (j < b.len() && !b[j].is_ascii_digit()) {
            let (ac, bc) = (order(a.get(i).copied()), order(b.get(j).copied()));
            if ac != bc {
                return ac.cmp(&bc);
            }
            i += 1;
            j += 1;
        }
        while a.get(i) == Some(&b'0') {
            i += 1;
        }
        while b.get(j) == Some(&b'0') {
            j += 1;
        }
        let mut first_diff = Ordering::Equal;
        while i < a.len() && a[i].is_ascii_digit() && j < b.len() && b[j].is_ascii_digit() {
            if first_diff == Ordering::Equal {
                first_diff = a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
        if i < a.len() && a[i].is_ascii_digit() {
            return Ordering::Greater;
        }
        if j < b.len() && b[j].is_ascii_digit() {
            return Ordering::Less;
        }
        if first_diff != Ordering::Equal {
            return first_diff;
        }
    }
    Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_versions_order_as_dpkg_orders_them() {
        let less = [
            ("3.11.2-6+deb12u5", "3.11.2-6+deb12u9"),
            ("3.11.2-6+deb12u9", "3.11.2-6+deb12u10"),
            ("3.11.2-6", "3.11.2-6+deb12u1"),
            ("1.0~rc1", "1.0"),
            ("1.0", "1.0a"),
            ("9.9", "1:0.1"),
            ("1.2-1", "1.10-1"),
            ("1.0-1", "1.0-1.1"),
        ];
        for (a, b) in less {
            assert_eq!(compare(a, b), Ordering::Less, "{a} < {b}");
            assert_eq!(compare(b, a), Ordering::Greater, "{b} > {a}");
        }
        assert_eq!(compare("3.11.2-6+deb12u9", "3.11.2-6+deb12u9"), Ordering::Equal);
        assert_eq!(compare("1.01", "1.1"), Ordering::Equal);
    }

    #[test]
    fn a_rootfs_copied_before_a_host_update_is_stale() {
        let recorded = BTreeMap::from([
            ("python3.11-minimal".to_string(), "3.11.2-6+deb12u5".to_string()),
            ("libpython3.11-minimal".to_string(), "3.11.2-6+deb12u9".to_string()),
            ("gone".to_string(), "1".to_string()),
        ]);
        let host = BTreeMap::from([
            ("python3.11-minimal".to_string(), "3.11.2-6+deb12u9".to_string()),
            ("libpython3.11-minimal".to_string(), "3.11.2-6+deb12u9".to_string()),
        ]);
        assert_eq!(
            stale(&recorded, &host),
            vec![Stale {
                package: "python3.11-minimal".into(),
                rootfs: "3.11.2-6+deb12u5".into(),
                host: "3.11.2-6+deb12u9".into()
            }]
        );
    }
}
