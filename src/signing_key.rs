//! The server's ed25519 signing key: generated on first start, kept in one
//! file, reused on every later start. The file uses the one-line format
//! Synapse uses (`ed25519 <version> <unpadded base64 seed>`), so a key can move
//! between the two.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use rand::Rng;
use ruma::signatures::Ed25519KeyPair;

/// A loaded signing key.
pub struct ServerKey {
    /// The key version (the part after `ed25519:` in a key id).
    pub version: String,
    /// The key pair in the form ruma's signing functions take.
    pub pair: Ed25519KeyPair,
}

impl std::fmt::Debug for ServerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerKey").field("version", &self.version).finish_non_exhaustive()
    }
}

impl ServerKey {
    /// The key id, `ed25519:<version>`.
    pub fn key_id(&self) -> String {
        format!("ed25519:{}", self.version)
    }

    /// The public key, unpadded base64, as published in `/_matrix/key/v2/server`.
    pub fn public_key_base64(&self) -> String {
        STANDARD_NO_PAD.encode(self.pair.public_key())
    }
}

/// Loads the key from `path`, generating and writing a new one if the file
/// does not exist.
pub fn load_or_generate(path: &Path) -> Result<ServerKey, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text).map_err(|e| format!("signing key {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut seed = [0u8; 32];
            rand::rng().fill_bytes(&mut seed);
            // Key versions are [a-zA-Z0-9_]; six random alphanumerics after "a_" as Synapse does.
            const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
            let mut rng = rand::rng();
            let tail: String =
                (0..6).map(|_| char::from(ALPHABET[(rng.next_u32() as usize) % ALPHABET.len()])).collect();
            let version = format!("a_{tail}");
            let line = format!("ed25519 {version} {}\n", STANDARD_NO_PAD.encode(seed));
            let key = parse(&line).map_err(|e| format!("signing key {}: {e}", path.display()))?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("signing key {}: cannot create directory: {e}", path.display()))?;
            }
            write_private(path, &line)
                .map_err(|e| format!("signing key {}: cannot write: {e}", path.display()))?;
            tracing::info!(path = %path.display(), %version, "generated a new signing key");
            Ok(key)
        }
        Err(e) => Err(format!("signing key {}: cannot read: {e}", path.display())),
    }
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

/// Parses the first key line of a key file.
pub fn parse(text: &str) -> Result<ServerKey, String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).ok_or("the file is empty")?;
    let mut parts = line.split_whitespace();
    let (Some(algorithm), Some(version), Some(seed), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("expected one line \"ed25519 <version> <base64 seed>\"".into());
    };
    if algorithm != "ed25519" {
        return Err(format!("unsupported algorithm {algorithm:?}"));
    }
    if version.is_empty() || !version.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("invalid key version {version:?}"));
    }
    // Lenient like Synapse: the spec's own test key has non-zero trailing bits.
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let seed = lenient.decode(seed).map_err(|e| format!("the seed is not base64: {e}"))?;
    let seed: [u8; 32] = seed.try_into().map_err(|_| "the seed is not 32 bytes".to_string())?;
    let der =
        SigningKey::from_bytes(&seed).to_pkcs8_der().map_err(|e| format!("cannot encode the key: {e}"))?;
    let pair = Ed25519KeyPair::from_der(der.as_bytes(), version.to_owned())
        .map_err(|e| format!("invalid key: {e}"))?;
    Ok(ServerKey { version: version.to_owned(), pair })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_key_is_reused() {
        let dir = std::env::temp_dir().join(format!("seqline-key-{}", std::process::id()));
        let path = dir.join("signing.key");
        let _ = std::fs::remove_dir_all(&dir);
        let first = load_or_generate(&path).unwrap();
        let second = load_or_generate(&path).unwrap();
        assert_eq!(first.version, second.version);
        assert_eq!(first.public_key_base64(), second.public_key_base64());
        assert!(first.key_id().starts_with("ed25519:a_"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn seed_gives_the_rfc8032_public_key() {
        // RFC 8032 section 7.1, test 1: this secret key has this public key.
        let seed = [
            0x9d, 0x61, 0xb1, 0x9d, 0xef, 0xfd, 0x5a, 0x60, 0xba, 0x84, 0x4a, 0xf4, 0x92, 0xec, 0x2c, 0xc4,
            0x44, 0x49, 0xc5, 0x69, 0x7b, 0x32, 0x69, 0x19, 0x70, 0x3b, 0xac, 0x03, 0x1c, 0xae, 0x7f, 0x60,
        ];
        let key = parse(&format!("ed25519 a_test {}", STANDARD_NO_PAD.encode(seed))).unwrap();
        assert_eq!(key.public_key_base64(), "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo");
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(parse("").is_err());
        assert!(parse("rsa a_x AAAA").is_err());
        assert!(parse("ed25519 a_x notbase64!").is_err());
        assert!(parse("ed25519 a_x AAAA").unwrap_err().contains("32 bytes"));
    }
}
