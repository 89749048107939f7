//! libfabric's text forms of an [`Info`]: `fi_info`'s short and verbose layouts (the verbose
//! one is what `fi_tostr(FI_TYPE_INFO)` returns), and the `FI_PROVIDER` filter. Shared by the
//! `xfabric` command and the C library so both print and filter alike.

use std::fmt::Write as _;

use crate::{
    addr_format_str, caps_str, mode_str, mr_mode_str, order_str, protocol_str, Info, FI_ADDR_STR,
    FI_ORDER_NONE, FI_ORDER_STRICT,
};

/// `FI_PROVIDER`: `a,b` admits only those providers, `^a,b` every provider but those.
#[derive(Debug, Default)]
pub struct ProviderFilter {
    /// The variable's text, as given.
    pub text: String,
    names: Vec<String>,
    exclude: bool,
}

impl ProviderFilter {
    /// The filter `value` (FI_PROVIDER's text) describes; `None` admits every provider.
    pub fn from_env(value: Option<&str>) -> Self {
        let Some(text) = value else {
            return Self::default();
        };
        let text = text.to_string();
        let (exclude, list) = match text.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        let names = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        Self {
            names,
            exclude,
            text,
        }
    }

    /// Whether getinfo may return `provider`'s entries.
    pub fn admits(&self, provider: &str) -> bool {
        if self.names.is_empty() {
            return true;
        }
        self.names.iter().any(|n| n == provider) != self.exclude
    }
}

/// `FI_VERSION(major, minor)` as `major.minor`.
pub fn version_str(v: u32) -> String {
    format!("{}.{}", v >> 16, v & 0xffff)
}

fn name_or_null(name: &Option<String>) -> &str {
    name.as_deref().unwrap_or("(null)")
}

/// fi_info's list form of a flag word: `[ FI_MSG, FI_TAGGED ]`, `[  ]` when empty.
fn list(joined: String) -> String {
    format!("[ {} ]", joined.replace(" | ", ", "))
}

/// Completion order has its own names: nothing is `FI_ORDER_NONE`, every ordering `FI_ORDER_STRICT`.
fn comp_order_str(order: u64) -> String {
    if order == FI_ORDER_NONE {
        return "FI_ORDER_NONE".into();
    }
    let mut parts = Vec::new();
    let mut rest = order;
    if order & FI_ORDER_STRICT == FI_ORDER_STRICT {
        parts.push("FI_ORDER_STRICT".to_string());
        rest &= !FI_ORDER_STRICT;
    }
    if rest != 0 {
        parts.push(order_str(rest));
    }
    parts.join(" | ")
}

/// An address as fi_info shows it: the string for `FI_ADDR_STR`, otherwise its bytes in hex.
fn addr_str(format: u32, addr: &Option<Vec<u8>>) -> String {
    match addr {
        None => "(null)".into(),
        Some(a) if format == FI_ADDR_STR => String::from_utf8_lossy(a)
            .trim_end_matches('\0')
            .to_string(),
        Some(a) => format!("0x{}", crate::hex::encode(a)),
    }
}

fn key_len(key: &Option<Vec<u8>>) -> usize {
    key.as_ref().map_or(0, Vec::len)
}

/// fi_info's default layout.
pub fn write_short(out: &mut String, info: &Info) {
    let _ = write!(
        out,
        "provider: {}\n    fabric: {}\n    domain: {}\n    version: {}\n    type: {}\n    protocol: {}\n",
        info.provider(),
        name_or_null(&info.fabric_attr.name),
        name_or_null(&info.domain_attr.name),
        version_str(info.fabric_attr.prov_version),
        info.ep_attr.ep_type.c_name(),
        protocol_str(info.ep_attr.protocol),
    );
}

/// `fi_tostr(FI_TYPE_INFO)`, which fi_info -v prints after a `---` line: the `fi_info:` tree, fields in `fi_tostr`'s order. Fields our `Info` does not
/// have (`handle`, `domain`, `nic`) print as the null values fi_info shows for a fresh info.
pub fn write_verbose(out: &mut String, i: &Info) {
    // A section heading is a key with an empty value, printed without the trailing space.
    let mut w = |indent: usize, key: &str, val: &dyn std::fmt::Display| {
        let val = val.to_string();
        let sep = if val.is_empty() { "" } else { " " };
        let _ = writeln!(out, "{:indent$}{key}:{sep}{val}", "", indent = indent * 4);
    };
    let (tx, rx, ep, dom, fab) = (
        &i.tx_attr,
        &i.rx_attr,
        &i.ep_attr,
        &i.domain_attr,
        &i.fabric_attr,
    );
    let addrlen = |a: &Option<Vec<u8>>| a.as_ref().map_or(0, Vec::len);
    let mr_mode = if dom.mr_mode == 0 {
        String::new()
    } else {
        mr_mode_str(dom.mr_mode)
    };

    w(0, "fi_info", &"");
    w(1, "caps", &list(caps_str(i.caps)));
    w(1, "mode", &list(mode_str(i.mode)));
    w(1, "addr_format", &addr_format_str(i.addr_format));
    w(1, "src_addrlen", &addrlen(&i.src_addr));
    w(1, "dest_addrlen", &addrlen(&i.dest_addr));
    w(1, "src_addr", &addr_str(i.addr_format, &i.src_addr));
    w(1, "dest_addr", &addr_str(i.addr_format, &i.dest_addr));
    w(1, "handle", &"(nil)");

    w(1, "fi_tx_attr", &"");
    w(2, "caps", &list(caps_str(tx.caps)));
    w(2, "mode", &list(mode_str(tx.mode)));
    w(2, "op_flags", &list(caps_str(tx.op_flags)));
    w(2, "msg_order", &list(order_str(tx.msg_order)));
    w(2, "comp_order", &list(comp_order_str(tx.comp_order)));
    w(2, "inject_size", &tx.inject_size);
    w(2, "size", &tx.size);
    w(2, "iov_limit", &tx.iov_limit);
    w(2, "rma_iov_limit", &tx.rma_iov_limit);
    w(2, "tclass", &format_args!("{:#x}", tx.tclass));

    w(1, "fi_rx_attr", &"");
    w(2, "caps", &list(caps_str(rx.caps)));
    w(2, "mode", &list(mode_str(rx.mode)));
    w(2, "op_flags", &list(caps_str(rx.op_flags)));
    w(2, "msg_order", &list(order_str(rx.msg_order)));
    w(2, "comp_order", &list(comp_order_str(rx.comp_order)));
    w(2, "total_buffered_recv", &rx.total_buffered_recv);
    w(2, "size", &rx.size);
    w(2, "iov_limit", &rx.iov_limit);

    w(1, "fi_ep_attr", &"");
    w(2, "type", &ep.ep_type.c_name());
    w(2, "protocol", &protocol_str(ep.protocol));
    w(2, "protocol_version", &ep.protocol_version);
    w(2, "max_msg_size", &ep.max_msg_size);
    w(2, "msg_prefix_size", &ep.msg_prefix_size);
    w(2, "max_order_raw_size", &ep.max_order_raw_size);
    w(2, "max_order_war_size", &ep.max_order_war_size);
    w(2, "max_order_waw_size", &ep.max_order_waw_size);
    w(
        2,
        "mem_tag_format",
        &format_args!("{:#018x}", ep.mem_tag_format),
    );
    w(2, "tx_ctx_cnt", &ep.tx_ctx_cnt);
    w(2, "rx_ctx_cnt", &ep.rx_ctx_cnt);
    w(2, "auth_key_size", &key_len(&ep.auth_key));

    w(1, "fi_domain_attr", &"");
    w(2, "domain", &"0x0");
    w(2, "name", &name_or_null(&dom.name));
    w(2, "threading", &dom.threading.c_name());
    w(2, "control_progress", &dom.control_progress.c_name());
    w(2, "data_progress", &dom.data_progress.c_name());
    w(2, "resource_mgmt", &dom.resource_mgmt.c_name());
    w(2, "av_type", &dom.av_type.c_name());
    w(2, "mr_mode", &list(mr_mode));
    w(2, "mr_key_size", &dom.mr_key_size);
    w(2, "cq_data_size", &dom.cq_data_size);
    w(2, "cq_cnt", &dom.cq_cnt);
    w(2, "ep_cnt", &dom.ep_cnt);
    w(2, "tx_ctx_cnt", &dom.tx_ctx_cnt);
    w(2, "rx_ctx_cnt", &dom.rx_ctx_cnt);
    w(2, "max_ep_tx_ctx", &dom.max_ep_tx_ctx);
    w(2, "max_ep_rx_ctx", &dom.max_ep_rx_ctx);
    w(2, "max_ep_stx_ctx", &dom.max_ep_stx_ctx);
    w(2, "max_ep_srx_ctx", &dom.max_ep_srx_ctx);
    w(2, "cntr_cnt", &dom.cntr_cnt);
    w(2, "mr_iov_limit", &dom.mr_iov_limit);
    w(2, "caps", &list(caps_str(dom.caps)));
    w(2, "mode", &list(mode_str(dom.mode)));
    let dom_key = match &dom.auth_key {
        Some(k) => k.len(),
        None => dom.auth_key_size,
    };
    w(2, "auth_key_size", &dom_key);
    w(2, "max_err_data", &dom.max_err_data);
    w(2, "mr_cnt", &dom.mr_cnt);
    w(2, "tclass", &format_args!("{:#x}", dom.tclass));

    w(1, "fi_fabric_attr", &"");
    w(2, "name", &name_or_null(&fab.name));
    w(2, "prov_name", &name_or_null(&fab.prov_name));
    w(2, "prov_version", &version_str(fab.prov_version));
    w(2, "api_version", &version_str(fab.api_version));
    w(1, "nic", &"(nil)");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{fi_version, FI_MSG, FI_ORDER_DATA, FI_ORDER_SAS, FI_TAGGED};

    #[test]
    fn fi_provider_admits_and_excludes() {
        let f = |v: &str| ProviderFilter::from_env(Some(v));
        assert!(f("shm").admits("shm") && !f("tcp,verbs").admits("shm"));
        assert!(!f("^shm").admits("shm") && f("^tcp").admits("shm"));
        assert!(ProviderFilter::from_env(None).admits("shm"));
    }

    #[test]
    fn values_print_as_fi_info_does() {
        assert_eq!(list(caps_str(FI_MSG | FI_TAGGED)), "[ FI_MSG, FI_TAGGED ]");
        assert_eq!(list(String::new()), "[  ]");
        assert_eq!(comp_order_str(0), "FI_ORDER_NONE");
        assert_eq!(
            comp_order_str(FI_ORDER_STRICT | FI_ORDER_DATA),
            "FI_ORDER_STRICT | FI_ORDER_DATA"
        );
        assert_eq!(comp_order_str(FI_ORDER_SAS), "FI_ORDER_SAS");
        assert_eq!(version_str(fi_version(1, 17)), "1.17");
        assert_eq!(
            addr_str(FI_ADDR_STR, &Some(b"fi_shm://7\0".to_vec())),
            "fi_shm://7"
        );
        assert_eq!(addr_str(1, &Some(vec![1, 0xab])), "0x01ab");
    }
}
