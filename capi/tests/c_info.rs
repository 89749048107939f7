//! fi_info through C: the layouts of capi's structures against fabric.h, and a C program built
//! against /usr/include/rdma and linked with this libfabric.so that allocates, fills (strdup,
//! malloc, as applications fill hints), duplicates and frees fi_info.
//!
//! Needs `cc` and libfabric-dev; skipped with a printed reason without them, except under CI.

use std::mem::{offset_of, size_of};

use fabric::info::*;

mod common;
use common::{have_toolchain, run_c};

#[test]
fn fi_info_layouts_match_fabric_h() {
    if !have_toolchain() {
        return;
    }
    // (C expression, Rust value): sizes, plus the offset of every structure's last members,
    // which moves if any member before it is wrong.
    let checks: Vec<(&str, usize)> = vec![
        ("sizeof(struct fi_info)", size_of::<FiInfo>()),
        (
            "offsetof(struct fi_info, addr_format)",
            offset_of!(FiInfo, addr_format),
        ),
        (
            "offsetof(struct fi_info, src_addrlen)",
            offset_of!(FiInfo, src_addrlen),
        ),
        (
            "offsetof(struct fi_info, tx_attr)",
            offset_of!(FiInfo, tx_attr),
        ),
        ("offsetof(struct fi_info, nic)", offset_of!(FiInfo, nic)),
        ("sizeof(struct fi_tx_attr)", size_of::<FiTxAttr>()),
        (
            "offsetof(struct fi_tx_attr, tclass)",
            offset_of!(FiTxAttr, tclass),
        ),
        ("sizeof(struct fi_rx_attr)", size_of::<FiRxAttr>()),
        (
            "offsetof(struct fi_rx_attr, iov_limit)",
            offset_of!(FiRxAttr, iov_limit),
        ),
        ("sizeof(struct fi_ep_attr)", size_of::<FiEpAttr>()),
        (
            "offsetof(struct fi_ep_attr, max_msg_size)",
            offset_of!(FiEpAttr, max_msg_size),
        ),
        (
            "offsetof(struct fi_ep_attr, auth_key)",
            offset_of!(FiEpAttr, auth_key),
        ),
        ("sizeof(struct fi_domain_attr)", size_of::<FiDomainAttr>()),
        (
            "offsetof(struct fi_domain_attr, mr_mode)",
            offset_of!(FiDomainAttr, mr_mode),
        ),
        (
            "offsetof(struct fi_domain_attr, mr_key_size)",
            offset_of!(FiDomainAttr, mr_key_size),
        ),
        (
            "offsetof(struct fi_domain_attr, caps)",
            offset_of!(FiDomainAttr, caps),
        ),
        (
            "offsetof(struct fi_domain_attr, tclass)",
            offset_of!(FiDomainAttr, tclass),
        ),
        ("sizeof(struct fi_fabric_attr)", size_of::<FiFabricAttr>()),
        (
            "offsetof(struct fi_fabric_attr, api_version)",
            offset_of!(FiFabricAttr, api_version),
        ),
    ];
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/fabric.h>\nint main(void) {\n",
    );
    for (expr, _) in &checks {
        src.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    src.push_str("  return 0;\n}\n");
    let out = run_c("layout", &src, false);
    let c: Vec<usize> = out.lines().map(|l| l.parse().expect("number")).collect();
    assert_eq!(c.len(), checks.len());
    for ((expr, rust), c) in checks.iter().zip(c) {
        assert_eq!(*rust, c, "{expr}: Rust {rust}, C {c}");
    }
}

const DUPINFO_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/fabric.h>

#define CHECK(c) do { if (!(c)) { printf("FAILED: %s line %d\n", #c, __LINE__); return 1; } } while (0)

int main(void) {
    struct fi_info *hints = fi_allocinfo();
    CHECK(hints && hints->tx_attr && hints->rx_attr && hints->ep_attr);
    CHECK(hints->domain_attr && hints->fabric_attr && !hints->next);
    /* What fabtests and fi_info do with hints: libc strings and addresses. */
    hints->fabric_attr->prov_name = strdup("shm");
    hints->domain_attr->name = strdup("dom");
    hints->caps = FI_MSG | FI_TAGGED;
    hints->mode = FI_CONTEXT;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR;
    hints->src_addr = malloc(16);
    memset(hints->src_addr, 7, 16);
    hints->src_addrlen = 16;
    hints->tx_attr->inject_size = 99;

    struct fi_info *copy = fi_dupinfo(hints);
    CHECK(copy && copy != hints);
    CHECK(copy->caps == (FI_MSG | FI_TAGGED) && copy->mode == FI_CONTEXT);
    CHECK(copy->ep_attr->type == FI_EP_RDM && copy->tx_attr->inject_size == 99);
    CHECK(copy->domain_attr->mr_mode == (FI_MR_LOCAL | FI_MR_VIRT_ADDR));
    CHECK(copy->fabric_attr->prov_name != hints->fabric_attr->prov_name);
    CHECK(strcmp(copy->fabric_attr->prov_name, "shm") == 0);
    CHECK(strcmp(copy->domain_attr->name, "dom") == 0);
    CHECK(copy->src_addr != hints->src_addr && copy->src_addrlen == 16);
    CHECK(memcmp(copy->src_addr, hints->src_addr, 16) == 0);
    CHECK(!copy->dest_addr && !copy->fabric_attr->name);

    /* A list: fi_freeinfo follows next. */
    hints->next = copy;
    fi_freeinfo(hints);
    fi_freeinfo(NULL);
    printf("ok\n");
    return 0;
}
"#;

#[test]
fn c_program_allocates_duplicates_and_frees_fi_info() {
    if !have_toolchain() {
        return;
    }
    assert_eq!(run_c("dupinfo", DUPINFO_C, true).trim(), "ok");
}
