//! The key of a sealed store ([`StoreKey`]) and its file.
//!
//! A key file holds the key as 64 hexadecimal digits and a newline (`rethread keygen`
//! writes lower case; either case and a missing newline, or a `\r\n`, are read too): text,
//! so it survives a copy through a terminal, a clipboard, `scp` or a secret manager that
//! takes only text, where raw bytes would not. Its permissions are checked before it is read:
//! like ssh with a private key, any permission for the group or for others is refused (a
//! service that shares the key with a group copies it into a file of its own user instead).

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use zeroize::{Zeroize, Zeroizing};

/// The length of a key in bytes (256 bits).
pub const KEY_LEN: usize = 32;

/// A 32-byte key that seals a store's transcript rows and mirror chunks.
///
/// Its bytes are wiped from memory when it is dropped, and never printed: `Debug` shows
/// `StoreKey(redacted)`; there is no `Display` and no serialization. Two keys are told apart
/// by [`StoreKey::fingerprint`].
#[derive(Clone)]
pub struct StoreKey {
    bytes: [u8; KEY_LEN],
}

/// A key file that could not be written or read. Each names the file, never its content.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Something is already at the path: a key is never overwritten.
    #[error("key file {} already exists; a key is never overwritten (choose a new path, or remove the old key once nothing is sealed with it)", path.display())]
    Exists {
        /// The key file.
        path: PathBuf,
    },
    /// The file can be read by its group or by others.
    #[error("key file {} is readable by other users (mode {mode:04o}); make it owner-only: chmod 600 {}", path.display(), path.display())]
    Exposed {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The path is not a regular file (a directory, a device, a pipe).
    #[error("key file {} is not a regular file", path.display())]
    NotAFile {
        /// The key file.
        path: PathBuf,
    },
    /// The file's content is not a key (its content is not repeated here).
    #[error("key file {} is not a rethread store key: expected 64 hexadecimal digits and a newline, as `rethread keygen` writes", path.display())]
    Malformed {
        /// The key file.
        path: PathBuf,
    },
    /// The file could not be created, written or read.
    #[error("cannot {action} key file {}: {source}", path.display())]
    Io {
        /// `create`, `write` or `read`.
        action: &'static str,
        /// The key file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The operating system's random number generator failed.
    #[error("cannot generate a key: the operating system's random number generator failed: {0}")]
    Random(getrandom::Error),
}

/// A key file is 65 bytes; anything much longer is not one (and is not read whole).
const MAX_FILE_LEN: u64 = 128;

/// Bound to every fingerprint, so that it is a hash of nothing but a rethread key.
const FINGERPRINT_LABEL: &[u8] = b"rethread store key fingerprint v1\0";

impl StoreKey {
    /// A new key from the operating system's random number generator.
    pub fn generate() -> Result<StoreKey, KeyError> {
        let mut key = StoreKey {
            bytes: [0; KEY_LEN],
        };
        getrandom::fill(&mut key.bytes).map_err(KeyError::Random)?;
        Ok(key)
    }

    /// Generates a key and writes it to a new file at `path`, owner-only (mode 0600) from its
    /// creation. Anything already at `path` (a file, a directory, a link, even a dangling
    /// one) is refused with [`KeyError::Exists`]; a file that could not be written whole is
    /// removed.
    pub fn write_new(path: &Path) -> Result<StoreKey, KeyError> {
        let key = StoreKey::generate()?;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(path).map_err(|source| match source.kind() {
            io::ErrorKind::AlreadyExists => KeyError::Exists { path: path.into() },
            _ => KeyError::Io {
                action: "create",
                path: path.into(),
                source,
            },
        })?;
        // Sized for the newline too: a buffer grown would leave a copy behind, unwiped.
        let mut text = Zeroizing::new(String::with_capacity(2 * KEY_LEN + 1));
        push_hex(&mut text, &key.bytes);
        text.push('\n');
        let written = file
            .write_all(text.as_bytes())
            .and_then(|()| file.sync_all());
        if let Err(source) = written {
            drop(file);
            // The file is ours (created just now) and holds no usable key.
            let _ = std::fs::remove_file(path);
            return Err(KeyError::Io {
                action: "write",
                path: path.into(),
                source,
            });
        }
        Ok(key)
    }

    /// Reads the key file at `path` (links followed). Refused, before its content is read: a
    /// path that is not a regular file ([`KeyError::NotAFile`]), and a file its group or
    /// others may read, write or execute ([`KeyError::Exposed`]). A content that is not a
    /// key is [`KeyError::Malformed`].
    pub fn read(path: &Path) -> Result<StoreKey, KeyError> {
        let io_error = |source| KeyError::Io {
            action: "read",
            path: path.into(),
            source,
        };
        // Checked before opening too: opening a pipe would wait for a writer.
        check_file(path, &std::fs::metadata(path).map_err(io_error)?)?;
        let file = File::open(path).map_err(io_error)?;
        // And again on what was opened, in case the path changed in between.
        check_file(path, &file.metadata().map_err(io_error)?)?;
        let mut text = Zeroizing::new(Vec::with_capacity(MAX_FILE_LEN as usize));
        file.take(MAX_FILE_LEN)
            .read_to_end(&mut text)
            .map_err(io_error)?;
        StoreKey::from_text(&text).ok_or_else(|| KeyError::Malformed { path: path.into() })
    }

    /// A short name for the key, 8 hexadecimal digits, for people to tell keys apart (which
    /// key a store was sealed with, which file holds the new one). It reveals nothing useful
    /// about the key: it is 32 bits of a SHA-256 hash of a fixed label and the key, and
    /// finding a key from it means trying 2^256 keys.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::new()
            .chain_update(FINGERPRINT_LABEL)
            .chain_update(self.bytes)
            .finalize();
        let mut text = String::with_capacity(8);
        push_hex(&mut text, &digest[..4]);
        text
    }

    /// The key's bytes, for the store's sealing.
    #[cfg_attr(not(test), allow(dead_code, reason = "read by the sealing (issue 43)"))]
    pub(crate) fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.bytes
    }

    /// The key of a key file's content: 64 hexadecimal digits, then nothing, `\n` or `\r\n`.
    fn from_text(text: &[u8]) -> Option<StoreKey> {
        let text = text.strip_suffix(b"\n").unwrap_or(text);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.len() != 2 * KEY_LEN {
            return None;
        }
        let mut key = StoreKey {
            bytes: [0; KEY_LEN],
        };
        for (byte, pair) in key.bytes.iter_mut().zip(text.chunks_exact(2)) {
            *byte = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
        }
        Some(key)
    }
}

/// Refuses what is not a regular file, and (Unix) a file with any permission for its group or
/// others.
fn check_file(path: &Path, metadata: &std::fs::Metadata) -> Result<(), KeyError> {
    if !metadata.is_file() {
        return Err(KeyError::NotAFile { path: path.into() });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = metadata.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed {
                path: path.into(),
                mode,
            });
        }
    }
    Ok(())
}

fn hex_digit(digit: u8) -> Option<u8> {
    char::from(digit).to_digit(16).map(|value| value as u8)
}

/// Appends `bytes` to `text` in lower-case hexadecimal.
fn push_hex(text: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

impl Drop for StoreKey {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreKey(redacted)")
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn hex(key: &StoreKey) -> String {
        let mut text = String::new();
        push_hex(&mut text, key.as_bytes());
        text
    }

    fn set_mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn generated_keys_differ_and_are_not_all_zero() {
        let (a, b) = (StoreKey::generate().unwrap(), StoreKey::generate().unwrap());
        assert_ne!(a.as_bytes(), b.as_bytes());
        assert_ne!(a.as_bytes(), &[0; KEY_LEN]);
    }

    #[test]
    fn a_written_key_is_owner_only_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.key");
        let key = StoreKey::write_new(&path).unwrap();
        let metadata = std::fs::metadata(&path).unwrap();
        assert_eq!(metadata.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{}\n", hex(&key)));
        assert_eq!(StoreKey::read(&path).unwrap().as_bytes(), key.as_bytes());
    }

    #[test]
    fn write_new_never_overwrites_a_file_a_directory_or_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("old.key");
        std::fs::write(&file, "keep me").unwrap();
        let dangling = dir.path().join("dangling.key");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        for path in [&file, &dangling, &dir.path().to_path_buf()] {
            let error = StoreKey::write_new(path).unwrap_err();
            assert!(matches!(error, KeyError::Exists { .. }), "{error:?}");
            assert!(error.to_string().contains(&path.display().to_string()));
        }
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
        assert!(!dir.path().join("nowhere").exists());
    }

    #[test]
    fn a_key_readable_by_the_group_or_others_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.key");
        StoreKey::write_new(&path).unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o601] {
            set_mode(&path, mode);
            let error = StoreKey::read(&path).unwrap_err();
            assert!(
                matches!(error, KeyError::Exposed { .. }),
                "{mode:o}: {error:?}"
            );
            let message = error.to_string();
            assert!(
                message.contains(&format!("chmod 600 {}", path.display())),
                "{message}"
            );
        }
        set_mode(&path, 0o400);
        assert!(StoreKey::read(&path).is_ok());
    }

    #[test]
    fn a_directory_is_not_a_key_file() {
        let dir = tempfile::tempdir().unwrap();
        set_mode(dir.path(), 0o700);
        let error = StoreKey::read(dir.path()).unwrap_err();
        assert!(matches!(error, KeyError::NotAFile { .. }), "{error:?}");
    }

    #[test]
    fn a_missing_key_file_names_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.key");
        let error = StoreKey::read(&path).unwrap_err();
        assert!(matches!(error, KeyError::Io { .. }), "{error:?}");
        assert!(error.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn a_malformed_key_file_is_refused_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.key");
        let secret = "s3cr3t-passw0rd";
        let cases = [
            secret.to_string(),
            "ab".repeat(31),
            "ab".repeat(33),
            format!("{}zz", "ab".repeat(31)),
            format!("{}\n\n", "ab".repeat(32)),
            format!(" {}", "ab".repeat(32)),
            format!("{}{secret}", "ab".repeat(32)),
            "ab".repeat(1000),
        ];
        for content in cases {
            std::fs::write(&path, &content).unwrap();
            set_mode(&path, 0o600);
            let error = StoreKey::read(&path).unwrap_err();
            assert!(matches!(error, KeyError::Malformed { .. }), "{error:?}");
            let message = error.to_string();
            assert!(
                !message.contains(secret) && !message.contains("abab"),
                "{message}"
            );
        }
    }

    #[test]
    fn either_case_and_line_ending_read_as_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.key");
        let hex = "00ff".repeat(16);
        let mut keys = Vec::new();
        for content in [
            hex.clone(),
            format!("{hex}\n"),
            format!("{hex}\r\n"),
            hex.to_uppercase(),
        ] {
            std::fs::write(&path, content).unwrap();
            set_mode(&path, 0o600);
            keys.push(StoreKey::read(&path).unwrap());
        }
        assert_eq!(keys[0].as_bytes()[..2], [0x00, 0xff]);
        assert!(keys.iter().all(|key| key.as_bytes() == keys[0].as_bytes()));
    }

    #[test]
    fn debug_and_fingerprint_never_show_the_key() {
        let key = StoreKey::generate().unwrap();
        let hex = hex(&key);
        assert_eq!(format!("{key:?}"), "StoreKey(redacted)");
        assert_eq!(
            format!("{:?}", Some(key.clone())),
            "Some(StoreKey(redacted))"
        );
        let fingerprint = key.fingerprint();
        assert_eq!(fingerprint.len(), 8);
        assert!(!hex.contains(&fingerprint));
        assert_eq!(fingerprint, key.clone().fingerprint());
        assert_ne!(fingerprint, StoreKey::generate().unwrap().fingerprint());
    }

    #[test]
    fn the_open_option_keeps_the_key_and_never_shows_it() {
        let key = StoreKey::generate().unwrap();
        let options = crate::OpenOptions::new().key(Some(key.clone()));
        assert_eq!(
            options.store_key().map(StoreKey::as_bytes),
            Some(key.as_bytes())
        );
        let shown = format!("{options:?}");
        assert!(
            shown.contains("StoreKey(redacted)") && !shown.contains(&hex(&key)),
            "{shown}"
        );
        assert!(crate::OpenOptions::new().store_key().is_none());
    }
}
