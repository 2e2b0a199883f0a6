//! Reaching Redis: a volume's engine opened (its keys named, Redis asked once that it is
//! there, keeps its writes and evicts nothing), and the one connection every request runs
//! on, made again after a failed request.

use super::scripts::Scripts;
use super::{Keys, RedisEngine, REQUEST_TIMEOUT};
use crate::engine::EngineError;
use crate::sync::Mutex;
use std::time::Duration;

impl RedisEngine {
    /// The engine for volume `volume` at `url` (`redis://HOST:PORT[/DB]`, `rediss://…` over
    /// TLS checked against the system's roots); connects once to say early if Redis is not
    /// there.
    pub fn open(url: &str, volume: &str) -> Result<RedisEngine, EngineError> {
        RedisEngine::open_with_ca(url, volume, None)
    }

    /// [`RedisEngine::open`]; a `rediss://` URL's server certificate checked against `ca`
    /// (PEM) when given, instead of the system's roots.
    pub fn open_with_ca(
        url: &str,
        volume: &str,
        ca: Option<Vec<u8>>,
    ) -> Result<RedisEngine, EngineError> {
        let shown = crate::engine::redacted(url);
        let client = match ca {
            Some(root_cert) => ::redis::Client::build_with_tls(
                url,
                ::redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                },
            ),
            None => ::redis::Client::open(url),
        }
        .map_err(|e| EngineError::Unavailable(format!("{shown}: {e}")))?;
        let k = |what: &str| format!("rmemfs:{{{volume}}}:{what}");
        let engine = RedisEngine {
            url: shown,
            client,
            conn: Mutex::new(None),
            waiting: Mutex::new(None),
            keys: Keys {
                head: k("head"),
                log: k("log"),
                vers: k("vers"),
                svers: k("svers"),
                vfloor: k("vfloor"),
                turns: k("turns"),
                wanted: k("wanted"),
                asked: k("asked:"),
                open: k("open:"),
                opened: k("opened:"),
                ckpt: k("ckpt"),
                sessions: k("sessions"),
                owed: k("owed"),
                beat: k("beat"),
                locks: k("locks"),
                servers: k("servers"),
                format: k("format"),
                nextino: k("nextino"),
                turn: k("turn"),
                prefix: k(""),
                state_info: k(crate::engine::state::INFO_HASH),
            },
            scripts: Scripts::new(),
            away: crate::engine::ENGINE_AWAY,
        };
        // A ping, not only a connection: a Redis that asks for a password (or refuses this
        // user) says so at the mount, not at the first change.
        engine.with(|c| ::redis::cmd("PING").query::<()>(c))?;
        engine.warn_without_aof();
        engine.refuse_eviction()?;
        Ok(engine)
    }

    /// Takes `away` for [`crate::engine::ENGINE_AWAY`] (tests of an engine away, in less time).
    pub fn with_away(mut self, away: Duration) -> RedisEngine {
        self.away = away;
        self
    }

    /// Runs `f` on the connection (made if there is none); a failed request drops it, so the
    /// next one connects again.
    pub(super) fn with<T>(
        &self,
        f: impl FnOnce(&mut ::redis::Connection) -> ::redis::RedisResult<T>,
    ) -> Result<T, EngineError> {
        let mut slot = self.conn.lock();
        if slot.is_none() {
            let c = self
                .client
                .get_connection_with_timeout(REQUEST_TIMEOUT)
                .map_err(|e| EngineError::Unreached(format!("{}: {e}", self.url)))?;
            c.set_read_timeout(Some(REQUEST_TIMEOUT))
                .and_then(|()| c.set_write_timeout(Some(REQUEST_TIMEOUT)))
                .map_err(|e| EngineError::Unreached(format!("{}: {e}", self.url)))?;
            *slot = Some(c);
        }
        let c = slot.as_mut().expect("connected above");
        f(c).map_err(|e| {
            *slot = None;
            EngineError::Unavailable(format!("{}: {e}", self.url))
        })
    }
}
