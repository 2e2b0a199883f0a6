//! A control session's handshake: `Hello`, the server's proof, the client's, a fabric
//! connection; until it is done no other request is served.

use super::session::{kind, Session};
use super::*;

impl Session {
    /// The handshake: `Hello` → `Challenge` (the server's proof) → `Proof` (the client's) →
    /// `Welcome`. `Err` ends the session with a `Fatal` saying why.
    pub(super) fn handshake(&mut self, msg: Message) -> Result<Message, String> {
        let shared = self.shared.clone();
        match (std::mem::replace(&mut self.state, Handshake::New), msg) {
            (
                Handshake::New,
                Message::Hello {
                    version,
                    client_name,
                    nonce,
                    observer,
                },
            ) => {
                self.observer = observer;
                if version != PROTOCOL_VERSION {
                    return Err(format!(
                        "protocol version {version} not supported (server speaks \
                         {PROTOCOL_VERSION})"
                    ));
                }
                if !observer && shared.clients.load(Ordering::SeqCst) >= shared.max_clients {
                    bump(&shared.refusals.refused_max_clients);
                    self.failure_counted = true;
                    log::warn!(
                        "refused client {:?} ('{client_name}'): {} clients already (--max-clients)",
                        self.peer,
                        shared.max_clients
                    );
                    return Err(format!(
                        "the server already serves {} clients (its --max-clients)",
                        shared.max_clients
                    ));
                }
                let server_nonce = auth::random_bytes::<{ auth::NONCE_LEN }>();
                let proof = shared.secret.server_proof(&auth::Transcript {
                    client_nonce: &nonce,
                    server_nonce: &server_nonce,
                    client_name: &client_name,
                });
                self.state = Handshake::Challenged {
                    client_nonce: nonce,
                    server_nonce,
                    client_name,
                };
                Ok(Message::Challenge {
                    version: PROTOCOL_VERSION,
                    nonce: server_nonce,
                    authenticated: shared.secret.is_set(),
                    proof,
                })
            }
            (
                Handshake::Challenged {
                    client_nonce,
                    server_nonce,
                    client_name,
                },
                Message::Proof { proof },
            ) => {
                let t = auth::Transcript {
                    client_nonce: &client_nonce,
                    server_nonce: &server_nonce,
                    client_name: &client_name,
                };
                if !auth::proofs_match(&proof, &shared.secret.client_proof(&t)) {
                    bump(&shared.refusals.refused_secret);
                    self.failure_counted = true;
                    log::warn!(
                        "refused client {:?} ('{client_name}'): it does not hold this server's \
                         secret",
                        self.peer
                    );
                    return Err(
                        "authentication failed: wrong secret (check --secret-file on \
                                the mount and on the server)"
                            .into(),
                    );
                }
                let token = shared.secret.session_token(&t);
                self.state = Handshake::Welcomed { token };
                self.client_name = client_name.clone();
                shared
                    .live_tokens
                    .lock()
                    .insert(token_digest(&token), self.conn);
                if !self.observer {
                    shared.clients.fetch_add(1, Ordering::SeqCst);
                }
                log::info!(
                    "client '{client_name}' connected from {:?}{}",
                    self.peer,
                    if shared.secret.is_set() {
                        " (authenticated)"
                    } else {
                        ""
                    }
                );
                Ok(Message::Welcome {
                    version: PROTOCOL_VERSION,
                    server_instance: shared.instance,
                    fabric: shared.fabric.name().into(),
                    capacity: shared.capacity(),
                    backed: shared.backing.is_some(),
                })
            }
            (Handshake::New, other) => Err(format!("expected Hello first, got {}", kind(&other))),
            (_, other) => Err(format!("expected Proof, got {}", kind(&other))),
        }
    }
}
