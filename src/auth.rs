//! Who may use a memory server: a shared secret, a mutual challenge-response on every control
//! connection, and the session token that binds the connection's data path to it.
//!
//! The secret never crosses the wire. The client sends a random nonce in `Hello`; the server
//! answers with its own nonce and a proof (HMAC-SHA256 under the secret over a label, both
//! nonces and the client's name); the client checks it in constant time and answers with its
//! own proof under another label; the server checks that. Both then derive the session token
//! (a third label) without sending it in the handshake; the data connections of the session
//! present it, so a data connection that skipped the control handshake is closed at once.
//!
//! A server without a secret (`--insecure`, or loopback only) runs the same exchange under an
//! empty key and says so in its challenge: it authenticates nobody, and a client holding a
//! secret refuses it. There is no encryption: on a network others can watch, use a private
//! network or IPsec.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;
use zeroize::Zeroizing;

/// Bytes of a nonce, a proof and a session token.
pub const NONCE_LEN: usize = 32;
pub const PROOF_LEN: usize = 32;
pub use crate::fabric::{Token, TOKEN_LEN};

/// Bytes of a fresh secret from `rmemfs keygen` (256 bits).
pub const SECRET_LEN: usize = 32;

/// The shortest secret accepted from a file: 128 bits.
pub const MIN_SECRET_LEN: usize = 16;

/// The environment variable that names a secret file when `--secret-file` is not given.
pub const SECRET_FILE_ENV: &str = "RMEMFS_SECRET_FILE";

pub type Nonce = [u8; NONCE_LEN];
pub type Proof = [u8; PROOF_LEN];

/// The shared secret (wiped from memory when dropped). `None` inside: no secret.
#[derive(Clone, Default)]
pub struct Secret(Option<Zeroizing<Vec<u8>>>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Secret(set)"
        } else {
            "Secret(none)"
        })
    }
}

impl Secret {
    /// No secret: the exchange runs under an empty key and proves nothing.
    pub fn none() -> Secret {
        Secret(None)
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Reads a secret file: hex digits (whitespace ignored), at least 128 bits.
    pub fn from_file(path: &Path) -> Result<Secret, String> {
        let text = Zeroizing::new(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the secret file {}: {e}", path.display()))?,
        );
        let hex: Zeroizing<String> = Zeroizing::new(text.split_whitespace().collect());
        let bytes = decode_hex(&hex).ok_or_else(|| {
            format!(
                "the secret file {} does not hold hex digits (make one with `rmemfs keygen`)",
                path.display()
            )
        })?;
        if bytes.len() < MIN_SECRET_LEN {
            return Err(format!(
                "the secret in {} is {} bytes; at least {MIN_SECRET_LEN} are needed",
                path.display(),
                bytes.len()
            ));
        }
        Ok(Secret(Some(bytes)))
    }

    /// The secret named by `--secret-file`, else by the environment, else none.
    pub fn from_option(path: Option<&Path>) -> Result<Secret, String> {
        match path {
            Some(p) => Secret::from_file(p),
            None => match std::env::var_os(SECRET_FILE_ENV) {
                Some(p) if !p.is_empty() => Secret::from_file(Path::new(&p)),
                _ => Ok(Secret::none()),
            },
        }
    }

    fn key(&self) -> &[u8] {
        self.0.as_deref().map_or(&[], |v| v.as_slice())
    }

    fn mac(&self, label: &[u8], t: &Transcript<'_>) -> [u8; 32] {
        let mut m = Hmac::<Sha256>::new_from_slice(self.key()).expect("HMAC takes any key length");
        m.update(label);
        // Bound to the version both ends speak: a proof for one protocol is none for another.
        m.update(&crate::proto::PROTOCOL_VERSION.to_le_bytes());
        m.update(t.client_nonce);
        m.update(t.server_nonce);
        m.update(&(t.client_name.len() as u64).to_le_bytes());
        m.update(t.client_name.as_bytes());
        m.finalize().into_bytes().into()
    }

    /// The server's proof that it holds the secret.
    pub fn server_proof(&self, t: &Transcript<'_>) -> Proof {
        self.mac(b"rmemfs/2 server proof", t)
    }

    /// The client's proof that it holds the secret.
    pub fn client_proof(&self, t: &Transcript<'_>) -> Proof {
        self.mac(b"rmemfs/2 client proof", t)
    }

    /// The session token both ends derive; the session's data connections present it.
    pub fn session_token(&self, t: &Transcript<'_>) -> Token {
        self.mac(b"rmemfs/2 session token", t)
    }
}

/// What both proofs and the token are computed over: both nonces and the client's name.
pub struct Transcript<'a> {
    pub client_nonce: &'a Nonce,
    pub server_nonce: &'a Nonce,
    pub client_name: &'a str,
}

/// Compares two proofs in constant time.
pub fn proofs_match(a: &Proof, b: &Proof) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// Random bytes from the operating system's CSPRNG.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the operating system's random source failed");
    b
}

pub use crate::fabric::random_u64;

/// `rmemfs keygen PATH`: writes a fresh random secret to a new file of mode 0600.
pub fn keygen(path: &Path, force: bool) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let secret = Zeroizing::new(random_bytes::<SECRET_LEN>());
    let hex = Zeroizing::new(encode_hex(&*secret) + "\n");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).mode(0o600);
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "{} exists; pass --force to replace it (every server and mount using the old \
                 secret must then get the new one)",
                path.display()
            )
        } else {
            format!("cannot create {}: {e}", path.display())
        }
    })?;
    // An existing file opened with --force keeps its mode: make it private too.
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot make {} private: {e}", path.display()))?;
    f.write_all(hex.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn encode_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn decode_hex(s: &str) -> Option<Zeroizing<Vec<u8>>> {
    if s.is_empty() || !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Zeroizing::new(Vec::with_capacity(bytes.len() / 2));
    for pair in bytes.chunks(2) {
        out.push(digit(pair[0])? << 4 | digit(pair[1])?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript<'a>(cn: &'a Nonce, sn: &'a Nonce) -> Transcript<'a> {
        Transcript {
            client_nonce: cn,
            server_nonce: sn,
            client_name: "client",
        }
    }

    #[test]
    fn proofs_bind_the_secret_both_nonces_and_the_role() {
        let dir = std::env::temp_dir().join(format!("rmemfs-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (pa, pb) = (dir.join("a"), dir.join("b"));
        let _ = std::fs::remove_file(&pa);
        let _ = std::fs::remove_file(&pb);
        keygen(&pa, false).unwrap();
        keygen(&pb, false).unwrap();
        assert!(keygen(&pa, false).is_err(), "keygen must not overwrite");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&pa).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let a = Secret::from_file(&pa).unwrap();
        let b = Secret::from_file(&pb).unwrap();
        let (cn, sn) = (random_bytes::<32>(), random_bytes::<32>());
        let t = transcript(&cn, &sn);
        assert!(proofs_match(&a.server_proof(&t), &a.server_proof(&t)));
        assert!(!proofs_match(&a.server_proof(&t), &b.server_proof(&t)));
        assert!(!proofs_match(&a.server_proof(&t), &a.client_proof(&t)));
        assert_ne!(a.session_token(&t), b.session_token(&t));
        let other = random_bytes::<32>();
        assert!(!proofs_match(
            &a.client_proof(&t),
            &a.client_proof(&transcript(&cn, &other))
        ));
        assert!(!proofs_match(
            &a.client_proof(&t),
            &a.client_proof(&transcript(&other, &sn))
        ));
        // No secret proves nothing but still agrees with itself.
        let none = Secret::none();
        assert!(proofs_match(&none.server_proof(&t), &none.server_proof(&t)));
        assert!(!proofs_match(&none.server_proof(&t), &a.server_proof(&t)));
        std::fs::write(&pb, "not hex").unwrap();
        assert!(Secret::from_file(&pb).unwrap_err().contains("hex"));
        std::fs::write(&pb, "00ff").unwrap();
        assert!(Secret::from_file(&pb).unwrap_err().contains("at least"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
