//! sha256 helpers shared by policy hashing, artifact hashing and the input
//! dir's digest.

use sha2::{Digest, Sha256};

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A sha256 fed in pieces, for files read in chunks.
#[derive(Clone, Default)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn new() -> Hasher {
        Hasher(Sha256::new())
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// Lowercase hex of the digest.
    pub fn finish_hex(self) -> String {
        self.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The raw sha256 of `bytes`.
pub(crate) fn sha256_bytes(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_abc_is_the_known_vector() {
        assert_eq!(super::sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn hasher_fed_in_pieces_matches_the_one_shot_digest() {
        let mut h = super::Hasher::new();
        h.update(b"a");
        h.update(b"bc");
        assert_eq!(h.finish_hex(), super::sha256_hex(b"abc"));
    }
}
