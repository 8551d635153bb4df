//! The secret a process keys its limits' tables and its key digests with: the SipHash
//! seed of key hashes (`KeySeed`) and the secret that digests of key parts are keyed with
//! when the file gives no `keys_secret`. Drawn at start, and kept in the state directory
//! when a limit persists its state (`crate::persist`), so that a table read back after a
//! restart is keyed as the requests that follow, and `GET /bans`, log lines and the
//! dashboard write a key as they did.

use crate::policy::key::KeySeed;

/// Both secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySecret {
    pub seed: KeySeed,
    /// HMAC-SHA-256 key of digests (`KeyText`) when no `keys_secret` is given.
    pub digest: [u8; 32],
}

/// How a secret is kept in a file: this magic (with the format's version), then the
/// seed and the digests' secret.
const MAGIC: &[u8; 8] = b"sgsecr01";
pub const FILE_LEN: usize = MAGIC.len() + 16 + 32;

impl KeySecret {
    /// A secret from the system's generator.
    pub fn draw() -> KeySecret {
        let mut bytes = [0u8; 48];
        // The system's generator does not fail on the systems sluicegate runs on; were it
        // to, fastrand's (seeded from the process's own randomness) still keeps the secret
        // unguessable to clients, who do not see the process.
        if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
            bytes.iter_mut().for_each(|b| *b = fastrand::u8(..));
        }
        let (seed, digest) = bytes.split_at(16);
        KeySecret { seed: KeySeed(seed.try_into().unwrap_or_default()), digest: digest.try_into().unwrap_or([0; 32]) }
    }

    /// The secret as its file holds it.
    pub fn to_file(&self) -> Vec<u8> {
        [MAGIC.as_slice(), &self.seed.0, &self.digest].concat()
    }

    /// The secret a file holds, if it holds one.
    pub fn from_file(bytes: &[u8]) -> Option<KeySecret> {
        let rest = bytes.strip_prefix(MAGIC.as_slice())?;
        if rest.len() != 48 {
            return None;
        }
        let (seed, digest) = rest.split_at(16);
        Some(KeySecret { seed: KeySeed(seed.try_into().ok()?), digest: digest.try_into().ok()? })
    }

    /// A value that tells whether a state file was keyed with this secret, without
    /// telling the secret (SipHash is a pseudo-random function of its key).
    pub fn check(&self) -> u64 {
        use std::hash::Hasher;
        let mut h = self.seed.hasher();
        h.write(b"sluicegate state file");
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_reads_back_from_its_file_and_nothing_else_does() {
        let secret = KeySecret::draw();
        let file = secret.to_file();
        assert_eq!(file.len(), FILE_LEN);
        assert!(KeySecret::from_file(&file) == Some(secret.clone()));
        assert!(KeySecret::from_file(&file[..FILE_LEN - 1]).is_none());
        assert!(KeySecret::from_file(&[file.as_slice(), b"x"].concat()).is_none());
        assert!(KeySecret::from_file(b"sgsecr02").is_none());
        assert!(KeySecret::draw() != secret, "two draws differ");
        assert_ne!(KeySecret::draw().check(), secret.check());
    }
}
