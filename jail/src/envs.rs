//! Variables a caller sets for one run, one session or one cell (`envs=`
//! in Python, `env` in a request, `--env NAME=VALUE` and `--env-fd` on the
//! command line): checked here, once, for every door.
//!
//! The values are given one by one, never the caller's environment
//! wholesale. A name must be a shell identifier and may not be one the
//! jail keeps for itself:
//! - `JAIL_*`: the jail's own (the cell driver reads `JAIL_PRELOAD`);
//! - `PYTHON*` and `LD_*`: they change how the interpreter or the loader
//!   start, before the first trusted line (a session's preload) runs;
//!   a policy may still set them in `environment.set`;
//! - the proxy variables: under `network.mode: allowlist` the jail points
//!   them at its proxy, and a caller's value would only break that.
//!
//! A caller's value wins over the policy's `environment.set` and `pass`
//! and over what the jail derives (the thread pools' sizes,
//! `MALLOC_ARENA_MAX`), never over the proxy's. Bounded: [`MAX_VARS`]
//! variables, [`MAX_JSON_BYTES`] as a JSON object; a value holds no NUL.

use std::collections::BTreeMap;
use std::io::Read;

use serde::{Deserialize, Serialize};

/// Variables one request may set.
pub const MAX_VARS: usize = 64;
/// The variables as a JSON object, at most: under a pipe's buffer, so that
/// a client writes them to `--env-fd` before the child reads.
pub const MAX_JSON_BYTES: usize = 32 << 10;

/// Names the jail sets itself under an allowlist (network.rs).
const PROXY_NAMES: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// Checked variables; serialised as a JSON object of strings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "BTreeMap<String, String>", into = "BTreeMap<String, String>")]
pub struct Envs(BTreeMap<String, String>);

/// Why a caller's variables were refused: the message names the variable
/// and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EnvError(String);

impl Envs {
    /// Check `vars`: names, reserved names, NULs and the bounds.
    pub fn check(vars: BTreeMap<String, String>) -> Result<Envs, EnvError> {
        if vars.len() > MAX_VARS {
            return Err(EnvError(format!("{} variables were given: set at most {MAX_VARS}", vars.len())));
        }
        for (name, value) in &vars {
            check_name(name)?;
            if value.contains('\0') {
                return Err(EnvError(format!("the value of {name} contains a NUL byte: remove it")));
            }
        }
        let bytes = serde_json::to_vec(&vars).map_or(usize::MAX, |v| v.len());
        if bytes > MAX_JSON_BYTES {
            return Err(EnvError(format!(
                "the variables take {bytes} bytes as JSON: keep them under {} KiB (pass larger data as a file)",
                MAX_JSON_BYTES >> 10
            )));
        }
        Ok(Envs(vars))
    }

    /// `NAME=VALUE` pairs, as `--env` gives them.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = &'a str>) -> Result<Envs, EnvError> {
        let mut vars = BTreeMap::new();
        for pair in pairs {
            let Some((name, value)) = pair.split_once('=') else {
                return Err(EnvError(format!("--env {pair:?} has no `=`: give NAME=VALUE")));
            };
            vars.insert(name.to_string(), value.to_string());
        }
        Envs::check(vars)
    }

    /// A JSON object of strings read from `from` (`--env-fd`), at most
    /// [`MAX_JSON_BYTES`].
    pub fn read_json(from: impl Read) -> Result<Envs, EnvError> {
        let mut text = Vec::new();
        from.take(MAX_JSON_BYTES as u64 + 1)
            .read_to_end(&mut text)
            .map_err(|e| EnvError(format!("read the variables: {e}")))?;
        if text.len() > MAX_JSON_BYTES {
            return Err(EnvError(format!("the variables are over {} KiB as JSON", MAX_JSON_BYTES >> 10)));
        }
        let vars: BTreeMap<String, String> = serde_json::from_slice(&text)
            .map_err(|e| EnvError(format!("the variables are not a JSON object of strings: {e}")))?;
        Envs::check(vars)
    }

    /// This and then `over`: `over`'s value wins for a name in both.
    pub fn and(&self, over: &Envs) -> Result<Envs, EnvError> {
        let mut vars = self.0.clone();
        vars.extend(over.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        Envs::check(vars)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter()
    }

    /// As one JSON object (`--env-fd`'s content).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.0).unwrap_or_default()
    }
}

impl TryFrom<BTreeMap<String, String>> for Envs {
    type Error = EnvError;
    fn try_from(vars: BTreeMap<String, String>) -> Result<Envs, EnvError> {
        Envs::check(vars)
    }
}

impl From<Envs> for BTreeMap<String, String> {
    fn from(envs: Envs) -> BTreeMap<String, String> {
        envs.0
    }
}

/// A shell identifier: a letter or `_`, then letters, digits and `_`.
pub(crate) fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn check_name(name: &str) -> Result<(), EnvError> {
    if name.len() > 128 || !valid_name(name) {
        let shown: String = name.chars().take(40).collect();
        return Err(EnvError(format!(
            "{shown:?} is not a variable name: use letters, digits and _, not starting with a digit (at most 128)"
        )));
    }
    let upper = name.to_ascii_uppercase();
    let why = if upper.starts_with("JAIL_") {
        Some("the jail's own")
    } else if upper.starts_with("PYTHON") || upper.starts_with("LD_") {
        Some("it changes how the interpreter starts: set it in the policy's environment.set")
    } else if PROXY_NAMES.contains(&name) {
        Some("the jail sets the proxy variables itself")
    } else {
        None
    };
    match why {
        Some(why) => Err(EnvError(format!("{name} may not be set by a request ({why})"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn names_are_identifiers_and_not_the_jails_own() {
        assert!(Envs::check(map(&[("API_KEY", "k"), ("_x1", ""), ("OMP_NUM_THREADS", "1")])).is_ok());
        for bad in [
            "",
            "1A",
            "A-B",
            "A=B",
            "A B",
            "É",
            "JAIL_PRELOAD",
            "jail_x",
            "PYTHONPATH",
            "pythonstartup",
            "LD_PRELOAD",
            "HTTPS_PROXY",
            "no_proxy",
        ] {
            Envs::check(map(&[(bad, "v")])).expect_err(bad);
        }
        assert!(Envs::check(map(&[(&"A".repeat(129), "v")])).is_err());
    }

    #[test]
    fn values_and_sizes_are_bounded() {
        assert!(Envs::check(map(&[("A", "x\0y")])).unwrap_err().to_string().contains("NUL"));
        let many: BTreeMap<String, String> = (0..=MAX_VARS).map(|i| (format!("V{i}"), String::new())).collect();
        assert!(Envs::check(many).is_err());
        assert!(Envs::check(map(&[("A", &"x".repeat(MAX_JSON_BYTES))])).is_err());
        // Escaping counts: a control character is six bytes of JSON.
        assert!(Envs::check(map(&[("A", &"\u{1}".repeat(MAX_JSON_BYTES / 6 + 1))])).is_err());
    }

    #[test]
    fn pairs_json_and_layering() {
        let e = Envs::from_pairs(["A=1", "B=x=y", "C="]).unwrap();
        assert_eq!(e.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(), ["A=1", "B=x=y", "C="]);
        assert!(Envs::from_pairs(["A"]).unwrap_err().to_string().contains("NAME=VALUE"));
        let j = Envs::read_json(&br#"{"B":"2","D":"4"}"#[..]).unwrap();
        let both = e.and(&j).unwrap();
        assert_eq!(both.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(), ["A=1", "B=2", "C=", "D=4"]);
        assert!(Envs::read_json(&br#"{"A":1}"#[..]).is_err());
        assert!(Envs::read_json(&br#"["A"]"#[..]).is_err());
        assert!(serde_json::from_str::<Envs>(r#"{"LD_PRELOAD":"x"}"#).is_err());
        assert_eq!(serde_json::to_string(&j).unwrap(), r#"{"B":"2","D":"4"}"#);
    }
}
