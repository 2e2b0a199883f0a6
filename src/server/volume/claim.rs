//! A volume's holder: its claim (a new epoch, the last holder fenced if it does not let go),
//! its resume after a lost link, and its departure (the volume keeps its extents).

use super::*;

impl Session {
    /// `VolumeClaim` (see [`Message::VolumeClaim`] and the module doc).
    pub(in crate::server) fn claim(
        &mut self,
        tag: u64,
        name: String,
        holder: String,
        mode: ClaimMode,
        takeover: bool,
        min_epoch: u64,
    ) -> Result<Message, String> {
        if !self.extents.is_empty()
            || !self.guards.is_empty()
            || self.volume.is_some()
            || self.follows.is_some()
        {
            return Err("VolumeClaim must come first after Welcome".into());
        }
        if !valid_name(&name) {
            return Ok(refuse(
                tag,
                RefusalCode::NoVolume,
                format!("'{name}' is no volume name (1 to {MAX_VOLUME_NAME} of A-Z a-z 0-9 . _ -)"),
            ));
        }
        if mode == ClaimMode::Follow {
            return Ok(self.follow(tag, name, holder));
        }
        if mode == ClaimMode::Share {
            return Ok(self.join(tag, name, holder));
        }
        let token = self.token().ok_or("VolumeClaim before Welcome")?;
        let shared = self.shared.clone();
        let deadline = Instant::now() + shared.control_timeout;
        let mut vols = shared.volumes.lock();
        loop {
            let Some(v) = vols.get_mut(&name) else {
                if mode == ClaimMode::Attach {
                    drop(vols);
                    return Ok(refuse(
                        tag,
                        RefusalCode::NoVolume,
                        format!(
                            "no volume '{name}' on this server (it holds: {})",
                            shared.known_volumes()
                        ),
                    ));
                }
                if vols.len() >= crate::config::MAX_VOLUMES_PER_SERVER {
                    return Ok(refuse(
                        tag,
                        RefusalCode::NoSpace,
                        format!(
                            "this server keeps {} volumes already (the most it keeps)",
                            vols.len()
                        ),
                    ));
                }
                let epoch = min_epoch.max(1);
                vols.insert(
                    name.clone(),
                    Volume {
                        conn: Some(self.conn),
                        token: Some(token_digest(&token)),
                        ..Volume::new(self.id, epoch, holder.clone())
                    },
                );
                log::info!("volume '{name}' made for {holder} at epoch {epoch}");
                self.volume = Some(name);
                drop(vols);
                shared.save_owners();
                return Ok(Message::VolumeClaimed {
                    tag,
                    epoch,
                    created: true,
                    root: Vec::new(),
                    extents: 0,
                    bytes: 0,
                });
            };
            if v.shared {
                return Ok(refuse(
                    tag,
                    RefusalCode::Held,
                    format!(
                        "volume '{name}' is shared by many writers (its namespace is in a \
                         metadata engine): mount it with that engine (--meta)"
                    ),
                ));
            }
            if mode == ClaimMode::Create {
                return Ok(refuse(
                    tag,
                    RefusalCode::VolumeExists,
                    format!(
                        "volume '{name}' exists already (held last by {}, epoch {}): attach \
                         without --create",
                        v.holder, v.epoch
                    ),
                ));
            }
            if let Some(conn) = v.conn {
                let idle = v.last_heard.elapsed();
                let silent = idle > shared.lease;
                // A holder that died a moment ago: its connection is closed, and its session
                // is about to depart (it is waited for below, not refused).
                let gone = !shared.holder_connected(v);
                if !takeover && !silent && !gone {
                    return Ok(refuse(
                        tag,
                        RefusalCode::Held,
                        format!(
                            "volume '{name}' is held by {} (epoch {}), heard {:.1} s ago: a \
                             second daemon is refused while it lives (--takeover fences it)",
                            v.holder,
                            v.epoch,
                            idle.as_secs_f64()
                        ),
                    ));
                }
                if Instant::now() >= deadline {
                    return Ok(refuse(
                        tag,
                        RefusalCode::Held,
                        format!(
                            "the holder of volume '{name}' ({}) did not let go in time",
                            v.holder
                        ),
                    ));
                }
                log::warn!(
                    "volume '{name}': fencing holder {} (epoch {}, heard {:.1} s ago) for {holder}",
                    v.holder,
                    v.epoch,
                    idle.as_secs_f64()
                );
                // Closing its control connection ends its session, whose departure closes
                // its data connections and parks the extents (see `depart_volume`).
                if let Some(s) = shared.sessions.lock().get(&conn) {
                    let _ = s.shutdown(Shutdown::Both);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                vols = shared.volume_changes.wait_timeout(vols, left).0;
                continue;
            }
            v.epoch = (v.epoch + 1).max(min_epoch);
            let digest = token_digest(&token);
            if let Some(old) = v.token.replace(digest) {
                if old != digest {
                    v.fenced.push(old);
                    if v.fenced.len() > FENCED_REMEMBERED {
                        v.fenced.remove(0);
                    }
                }
            }
            log::info!(
                "volume '{name}' claimed by {holder} at epoch {} (last held by {}): {} extents",
                v.epoch,
                v.holder,
                v.parked.len()
            );
            v.conn = Some(self.conn);
            v.holder = holder;
            v.last_heard = Instant::now();
            // A new holder learns every key at its attach (`VolumeExtents`).
            v.rekeyed = false;
            self.id = v.session_id;
            self.extents = std::mem::take(&mut v.parked);
            self.held = v.bytes;
            let reply = Message::VolumeClaimed {
                tag,
                epoch: v.epoch,
                created: false,
                root: v.root.clone(),
                extents: self.extents.len() as u64,
                bytes: self.held,
            };
            self.volume = Some(name);
            drop(vols);
            shared.save_owners();
            return Ok(reply);
        }
    }

    /// A resume by a volume's holder (a lost link): `None` if `old` held no volume here.
    pub(in crate::server) fn resume_volume(
        &mut self,
        tag: u64,
        old: &TokenDigest,
    ) -> Option<Result<Message, String>> {
        let shared = self.shared.clone();
        let deadline = Instant::now() + shared.control_timeout;
        let mut vols = shared.volumes.lock();
        let name = vols
            .iter()
            .find(|(_, v)| v.token.as_ref() == Some(old) || v.fenced.contains(old))
            .map(|(n, _)| n.clone())?;
        loop {
            let v = vols.get_mut(&name)?;
            if v.fenced.contains(old) {
                return Some(Ok(refuse(
                    tag,
                    RefusalCode::Fenced,
                    format!(
                        "volume '{name}' was taken over by {} at epoch {}: this daemon is fenced",
                        v.holder, v.epoch
                    ),
                )));
            }
            if let Some(conn) = v.conn {
                // The old connection is still open here: the client saw it fail first.
                if Instant::now() >= deadline {
                    return Some(Ok(refuse(
                        tag,
                        RefusalCode::NotFound,
                        "the session's old connection did not close in time".into(),
                    )));
                }
                if let Some(s) = shared.sessions.lock().get(&conn) {
                    let _ = s.shutdown(Shutdown::Both);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                vols = shared.volume_changes.wait_timeout(vols, left).0;
                continue;
            }
            let token = self.token()?;
            v.token = Some(token_digest(&token));
            v.conn = Some(self.conn);
            v.last_heard = Instant::now();
            self.id = v.session_id;
            self.extents = std::mem::take(&mut v.parked);
            self.held = v.bytes;
            self.volume = Some(name.clone());
            log::info!(
                "volume '{name}': holder {} resumed with {} extents",
                v.holder,
                self.extents.len()
            );
            crate::server::bump(&shared.refusals.resumed_sessions);
            let reply = Message::Resumed {
                tag,
                extents: self.extents.len() as u64,
                bytes: self.held,
                rekeyed: std::mem::take(&mut v.rekeyed),
                behind: std::mem::take(&mut v.behind),
            };
            if let Message::Resumed { rekeyed: true, .. } = reply {
                self.rekeyed = true;
            }
            drop(vols);
            shared.save_owners();
            return Some(Ok(reply));
        }
    }

    /// The holder's connection is gone (crash, unmount, fence, lost link): the volume keeps
    /// its extents. Returns false if this session holds no volume.
    pub(in crate::server) fn depart_volume(&mut self) -> bool {
        let Some(name) = self.volume.take() else {
            return false;
        };
        // Its data connections close first: nothing it posted lands after this.
        self.guards.clear();
        {
            let mut vols = self.shared.volumes.lock();
            if let Some(v) = vols.get_mut(&name) {
                if v.conn == Some(self.conn) {
                    v.conn = None;
                }
                v.parked.extend(std::mem::take(&mut self.extents));
                v.extents = v.parked.len() as u64;
                // A holder gone before it listed its new keys: the next one is told.
                v.rekeyed |= std::mem::take(&mut self.rekeyed);
                v.bytes = self.held;
                v.last_heard = Instant::now();
            }
        }
        log::info!("volume '{name}': its holder left; its extents stay with the volume");
        self.held = 0;
        self.shared.volume_changes.notify_all();
        true
    }
}
