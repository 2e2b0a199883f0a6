//! Device and GID choice, and device registrations.

use super::PORT;
use crate::fabric::FabricError;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::Arc;
use sideway::ibverbs::address::{Gid, GidType};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;

/// An error and its causes, `outer: inner: ...` (sideway's errors keep the errno in a cause).
pub(super) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

pub(super) fn unavailable(reason: impl Into<String>) -> FabricError {
    FabricError::Unavailable {
        fabric: "verbs",
        reason: reason.into(),
    }
}

/// Opens the named device, or the first one with an active port: its name, context, LID and
/// active MTU.
pub(super) fn open_device(
    list: &DeviceList,
    wanted_name: Option<&str>,
) -> Result<(String, Arc<DeviceContext>, u16, Mtu), FabricError> {
    let mut names = Vec::new();
    let mut chosen = None;
    for dev in list.iter() {
        let name = dev.name();
        names.push(name.clone());
        let wanted = match wanted_name {
            Some(want) => want == name,
            None => true,
        };
        if !wanted {
            continue;
        }
        let ctx = match dev.open() {
            Ok(ctx) => ctx,
            Err(e) if wanted_name.is_some() => {
                return Err(unavailable(format!(
                    "cannot open {name}: {}",
                    with_causes(&e)
                )))
            }
            Err(_) => continue,
        };
        let port = match ctx.query_port(PORT) {
            Ok(p) => p,
            Err(e) => return Err(unavailable(format!("cannot query {name} port 1: {e}"))),
        };
        if port.port_state() != PortState::Active {
            if wanted_name.is_some() {
                return Err(unavailable(format!(
                    "{name} port 1 is not active ({:?})",
                    port.port_state()
                )));
            }
            continue;
        }
        chosen = Some((name, ctx, port.lid(), port.active_mtu()));
        break;
    }
    let Some((device, ctx, lid, mtu)) = chosen else {
        return Err(unavailable(match wanted_name {
            Some(d) => format!("no RDMA device named {d} (found: {})", names.join(", ")),
            None => format!(
                "no RDMA device has an active port (found: {})",
                names.join(", ")
            ),
        }));
    };
    Ok((device, ctx, lid, mtu))
}

/// Index of the GID to use: the named one, else an IPv4-mapped RoCE v2 GID, else any
/// non-zero RoCE v2 GID, else any non-zero GID (InfiniBand).
pub(super) fn choose_gid(
    ctx: &Arc<DeviceContext>,
    wanted: Option<u32>,
) -> Result<(u32, Gid), String> {
    if let Some(i) = wanted {
        let gid = ctx
            .query_gid(PORT, i)
            .map_err(|e| format!("cannot read GID index {i}: {e}"))?;
        if gid.is_zero() {
            return Err(format!("GID index {i} is empty"));
        }
        return Ok((i, gid));
    }
    let table = ctx
        .query_gid_table()
        .map_err(|e| format!("cannot read the GID table: {e}"))?;
    let usable: Vec<_> = table
        .iter()
        .filter(|e| e.port_num() == u32::from(PORT) && !e.gid().is_zero())
        .collect();
    let v4_mapped = |g: &Gid| g.raw[..10].iter().all(|&b| b == 0) && g.raw[10..12] == [0xff; 2];
    let pick = usable
        .iter()
        .find(|e| e.gid_type() == GidType::RoceV2 && v4_mapped(&e.gid()))
        .or_else(|| usable.iter().find(|e| e.gid_type() == GidType::RoceV2))
        .or_else(|| usable.first())
        .ok_or("no usable GID on port 1 (does its network interface have an address?)")?;
    Ok((pick.gid_index(), pick.gid()))
}

/// A device registration; deregisters (`ibv_dereg_mr`) when the last holder lets go.
pub(super) struct DeviceMr {
    pub(super) _mr: Arc<MemoryRegion>,
    pub(super) len: u64,
    pub(super) pinned: Arc<AtomicU64>,
}

impl Drop for DeviceMr {
    fn drop(&mut self) {
        self.pinned.fetch_sub(self.len, Ordering::Relaxed);
    }
}
