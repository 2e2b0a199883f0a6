//! The redundancy a mount asks for, checked against the servers it names and the namespace
//! it serves, before anything is claimed: copies or an erasure code each need servers enough,
//! and a volume keeps no more copies, nor survives more lost servers, than its journal.

use super::asked::{MountConfig, Namespace};

impl MountConfig {
    /// Refuses `--replicas` or `--redundancy` that `servers` memory servers, or the
    /// namespace's journal, cannot keep, saying why.
    pub(super) fn check_redundancy(&self, servers: usize) -> Result<(), String> {
        let journal = crate::config::JOURNAL_COPIES;
        if let Some(coding) = self.coding {
            if matches!(self.namespace, Namespace::Held { .. }) && coding.m as usize >= journal {
                return Err(format!(
                    "--redundancy ec:{coding} on a volume: its journal keeps {journal} copies, \
                     which survive {} lost servers, not {}; use M of at most {}",
                    journal - 1,
                    coding.m,
                    journal - 1
                ));
            }
            if coding.width() > servers {
                return Err(format!(
                    "--redundancy ec:{coding} needs at least {} memory servers ({} given)",
                    coding.width(),
                    servers
                ));
            }
        }
        let replicas = self.replicas_for(servers);
        if replicas > journal && !matches!(self.namespace, Namespace::Private) {
            return Err(format!(
                "--replicas {replicas} on a volume: its journal keeps {journal} copies, which \
                 survive {} lost servers, not {}; use at most {journal}",
                journal - 1,
                replicas - 1
            ));
        }
        if replicas > servers {
            return Err(format!(
                "--replicas {replicas} needs at least {replicas} memory servers ({} given)",
                servers
            ));
        }
        Ok(())
    }
}
