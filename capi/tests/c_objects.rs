//! fids and ops tables through C: every table's layout and `size` against the 1.17 headers,
//! a C program that opens and closes every object and drives counters and ENOSYS slots
//! through the headers' inline calls, and fids of the wrong class refused with -FI_EINVAL.

use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::ptr::{null, null_mut};

use fabric::header::*;
use fabric::ops::*;

mod common;
use common::{have_toolchain, run_c};

#[test]
fn ops_tables_fids_and_attrs_match_the_headers() {
    if !have_toolchain() {
        return;
    }
    // (C expression, Rust value): each table's size (its `size` field says the same), each
    // head's last member, each attribute structure's size and last member.
    let checks: Vec<(&str, usize)> = vec![
        ("sizeof(struct fi_ops)", FiOps::ENOSYS.size),
        ("sizeof(struct fi_ops_fabric)", FiOpsFabric::ENOSYS.size),
        ("sizeof(struct fi_ops_domain)", FiOpsDomain::ENOSYS.size),
        ("sizeof(struct fi_ops_mr)", FiOpsMr::ENOSYS.size),
        ("sizeof(struct fi_ops_av)", FiOpsAv::ENOSYS.size),
        ("sizeof(struct fi_ops_cq)", FiOpsCq::ENOSYS.size),
        ("sizeof(struct fi_ops_cntr)", FiOpsCntr::ENOSYS.size),
        ("sizeof(struct fi_ops_eq)", FiOpsEq::ENOSYS.size),
        ("sizeof(struct fi_ops_wait)", FiOpsWait::ENOSYS.size),
        ("sizeof(struct fi_ops_ep)", FiOpsEp::ENOSYS.size),
        ("sizeof(struct fi_ops_msg)", FiOpsMsg::ENOSYS.size),
        ("sizeof(struct fi_ops_tagged)", FiOpsTagged::ENOSYS.size),
        ("sizeof(struct fi_ops_rma)", FiOpsRma::ENOSYS.size),
        ("sizeof(struct fi_ops_atomic)", FiOpsAtomic::ENOSYS.size),
        ("sizeof(struct fi_ops_cm)", FiOpsCm::ENOSYS.size),
        (
            "offsetof(struct fi_ops_cq, strerror)",
            offset_of!(FiOpsCq, strerror),
        ),
        (
            "offsetof(struct fi_ops_msg, injectdata)",
            offset_of!(FiOpsMsg, injectdata),
        ),
        (
            "offsetof(struct fi_ops_atomic, compwritevalid)",
            offset_of!(FiOpsAtomic, compwritevalid),
        ),
        ("sizeof(struct fid)", size_of::<Fid>()),
        ("offsetof(struct fid, ops)", offset_of!(Fid, ops)),
        ("sizeof(struct fid_fabric)", size_of::<FabricHead>()),
        (
            "offsetof(struct fid_fabric, api_version)",
            offset_of!(FabricHead, api_version),
        ),
        (
            "offsetof(struct fid_domain, mr)",
            offset_of!(DomainHead, mr),
        ),
        (
            "offsetof(struct fid_ep, collective)",
            offset_of!(EpHead, collective),
        ),
        (
            "offsetof(struct fid_cq, ops)",
            offset_of!(OpsHead<FiOpsCq>, ops),
        ),
        ("offsetof(struct fid_mr, key)", offset_of!(MrHead, key)),
        ("sizeof(struct fi_cq_attr)", size_of::<FiCqAttr>()),
        (
            "offsetof(struct fi_cq_attr, wait_set)",
            offset_of!(FiCqAttr, wait_set),
        ),
        ("sizeof(struct fi_cntr_attr)", size_of::<FiCntrAttr>()),
        (
            "offsetof(struct fi_cntr_attr, flags)",
            offset_of!(FiCntrAttr, flags),
        ),
        ("sizeof(struct fi_av_attr)", size_of::<FiAvAttr>()),
        (
            "offsetof(struct fi_av_attr, flags)",
            offset_of!(FiAvAttr, flags),
        ),
        ("sizeof(struct fi_eq_attr)", size_of::<FiEqAttr>()),
        (
            "offsetof(struct fi_eq_attr, wait_set)",
            offset_of!(FiEqAttr, wait_set),
        ),
        ("sizeof(struct fi_wait_attr)", size_of::<FiWaitAttr>()),
        ("sizeof(struct fi_mr_attr)", size_of::<FiMrAttr>()),
        (
            "offsetof(struct fi_mr_attr, device)",
            offset_of!(FiMrAttr, device),
        ),
        ("sizeof(struct fi_msg)", size_of::<FiMsg>()),
        ("offsetof(struct fi_msg, data)", offset_of!(FiMsg, data)),
        ("sizeof(struct fi_msg_tagged)", size_of::<FiMsgTagged>()),
        (
            "offsetof(struct fi_msg_tagged, context)",
            offset_of!(FiMsgTagged, context),
        ),
        (
            "sizeof(struct fi_cq_err_entry)",
            size_of::<xfabric::CqErrEntry>(),
        ),
        ("sizeof(struct fi_eq_err_entry)", size_of::<FiEqErrEntry>()),
        (
            "offsetof(struct fi_eq_err_entry, err_data_size)",
            offset_of!(FiEqErrEntry, err_data_size),
        ),
        ("sizeof(struct fi_ioc)", size_of::<FiIoc>()),
        ("sizeof(struct fi_rma_ioc)", size_of::<FiRmaIoc>()),
        (
            "offsetof(struct fi_rma_ioc, key)",
            offset_of!(FiRmaIoc, key),
        ),
        ("sizeof(struct fi_msg_atomic)", size_of::<FiMsgAtomic>()),
        (
            "offsetof(struct fi_msg_atomic, op)",
            offset_of!(FiMsgAtomic, op),
        ),
        (
            "offsetof(struct fi_msg_atomic, data)",
            offset_of!(FiMsgAtomic, data),
        ),
        ("sizeof(struct fi_atomic_attr)", size_of::<FiAtomicAttr>()),
        ("sizeof(struct fi_msg_fetch)", size_of::<FiMsgIoc>()),
        ("sizeof(struct fi_op_atomic)", size_of::<FiOpAtomic>()),
        (
            "offsetof(struct fi_op_fetch_atomic, flags)",
            offset_of!(FiOpFetchAtomic, flags),
        ),
        (
            "offsetof(struct fi_op_compare_atomic, compare)",
            offset_of!(FiOpCompareAtomic, compare),
        ),
        (
            "offsetof(struct fi_op_compare_atomic, flags)",
            offset_of!(FiOpCompareAtomic, flags),
        ),
    ];
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/fabric.h>\n\
         #include <rdma/fi_domain.h>\n#include <rdma/fi_endpoint.h>\n#include <rdma/fi_cm.h>\n\
         #include <rdma/fi_eq.h>\n#include <rdma/fi_rma.h>\n#include <rdma/fi_tagged.h>\n\
         #include <rdma/fi_atomic.h>\n#include <rdma/fi_trigger.h>\nint main(void) {\n",
    );
    for (expr, _) in &checks {
        src.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    src.push_str("  return 0;\n}\n");
    let out = run_c("ops_layout", &src, false);
    let c: Vec<usize> = out.lines().map(|l| l.parse().expect("number")).collect();
    assert_eq!(c.len(), checks.len());
    for ((expr, rust), c) in checks.iter().zip(c) {
        assert_eq!(*rust, c, "{expr}: Rust {rust}, C {c}");
    }
}

const OBJECTS_C: &str = r#"
#include <stdio.h>
#include <string.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_errno.h>

#define CHECK(c) do { if (!(c)) { printf("FAILED: %s line %d\n", #c, __LINE__); return 1; } } while (0)

int main(void) {
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    hints->fabric_attr->prov_name = strdup("shm");
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_TAGGED;
    CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0);

    struct fid_fabric *fabric; struct fid_domain *domain; struct fid_ep *ep;
    struct fid_cq *cq; struct fid_cntr *cntr; struct fid_av *av; struct fid_eq *eq;
    struct fid_mr *mr;
    int ctx;
    CHECK(fi_fabric(info->fabric_attr, &fabric, &ctx) == 0);
    CHECK(fabric->fid.fclass == FI_CLASS_FABRIC && fabric->fid.context == &ctx);
    CHECK(fabric->ops->size == sizeof(struct fi_ops_fabric));
    CHECK(fi_domain(fabric, info, &domain, NULL) == 0);
    CHECK(domain->ops->size == sizeof(struct fi_ops_domain));
    CHECK(domain->mr->size == sizeof(struct fi_ops_mr));

    struct fid_wait *ws;
    struct fi_wait_attr ws_attr = { .wait_obj = FI_WAIT_UNSPEC };
    CHECK(fi_wait_open(fabric, &ws_attr, &ws) == 0);
    CHECK(ws->ops->size == sizeof(struct fi_ops_wait));
    struct fid_cq *wcq;
    struct fi_cq_attr wcq_attr = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_SET, .wait_set = ws };
    CHECK(fi_cq_open(domain, &wcq_attr, &wcq, NULL) == 0);
    CHECK(fi_wait(ws, 0) == -FI_ETIMEDOUT);
    CHECK(fi_close(&wcq->fid) == 0);
    CHECK(fi_close(&ws->fid) == 0);

    struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .size = 16 };
    CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL) == 0);
    CHECK(cq->fid.fclass == FI_CLASS_CQ && cq->ops->size == sizeof(struct fi_ops_cq));
    struct fi_cq_tagged_entry e;
    CHECK(fi_cq_read(cq, &e, 1) == -FI_EAGAIN);

    struct fi_cntr_attr cntr_attr = { .events = FI_CNTR_EVENTS_COMP };
    CHECK(fi_cntr_open(domain, &cntr_attr, &cntr, NULL) == 0);
    CHECK(cntr->ops->size == sizeof(struct fi_ops_cntr));
    CHECK(fi_cntr_add(cntr, 5) == 0 && fi_cntr_read(cntr) == 5);
    CHECK(fi_cntr_set(cntr, 9) == 0 && fi_cntr_read(cntr) == 9);
    CHECK(fi_cntr_wait(cntr, 9, 1000) == 0);
    CHECK(fi_cntr_seterr(cntr, 2) == 0 && fi_cntr_readerr(cntr) == 2);

    struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
    CHECK(fi_av_open(domain, &av_attr, &av, NULL) == 0);
    struct fi_eq_attr eq_attr = { .size = 8, .wait_obj = FI_WAIT_UNSPEC };
    CHECK(fi_eq_open(fabric, &eq_attr, &eq, NULL) == 0);
    CHECK(eq->ops->size == sizeof(struct fi_ops_eq));
    /* What the application writes it reads back, its own fid included. */
    struct fi_eq_entry ev = { .fid = &domain->fid, .context = &ctx, .data = 77 }, got_ev;
    uint32_t event = 0;
    CHECK(fi_eq_read(eq, &event, &got_ev, sizeof got_ev, 0) == -FI_EAGAIN);
    CHECK(fi_eq_write(eq, FI_NOTIFY, &ev, sizeof ev, 0) == sizeof ev);
    CHECK(fi_eq_sread(eq, &event, &got_ev, sizeof got_ev, 1000, 0) == sizeof got_ev);
    CHECK(event == FI_NOTIFY && got_ev.fid == &domain->fid && got_ev.context == &ctx && got_ev.data == 77);
    /* A buffer smaller than the event gets what it holds (fi_eq(3): limited to the buffer
       space provided), and the event is read. */
    CHECK(fi_eq_write(eq, FI_NOTIFY, &ev, sizeof ev, 0) == sizeof ev);
    memset(&got_ev, 0, sizeof got_ev);
    CHECK(fi_eq_read(eq, &event, &got_ev, 4, 0) == 4);
    CHECK(memcmp(&got_ev, &ev, 4) == 0);
    CHECK(fi_eq_read(eq, &event, &got_ev, sizeof got_ev, 0) == -FI_EAGAIN);

    static char buf[4096];
    CHECK(fi_mr_reg(domain, buf, sizeof buf, FI_SEND | FI_RECV, 0, 0, 0, &mr, NULL) == 0);
    CHECK(mr->fid.fclass == FI_CLASS_MR && fi_mr_desc(mr) != NULL);

    CHECK(fi_endpoint(domain, info, &ep, NULL) == 0);
    CHECK(ep->ops->size == sizeof(struct fi_ops_ep) && ep->msg->size == sizeof(struct fi_ops_msg));
    CHECK(ep->rma->size == sizeof(struct fi_ops_rma) && ep->atomic->size == sizeof(struct fi_ops_atomic));
    CHECK(ep->cm->size == sizeof(struct fi_ops_cm) && ep->tagged->size == sizeof(struct fi_ops_tagged));
    CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) == 0);
    CHECK(fi_ep_bind(ep, &av->fid, 0) == 0);
    CHECK(fi_ep_bind(ep, &cntr->fid, FI_SEND) == 0);
    /* A fabric is nothing an endpoint binds to. */
    CHECK(fi_ep_bind(ep, &fabric->fid, 0) == -FI_EINVAL);
    CHECK(fi_enable(ep) == 0);
    /* An FI_ADDR_STR name is a C string: its NUL is written and counted, whatever the
       buffer held before. */
    char name[256]; size_t len = sizeof name;
    memset(name, 'x', sizeof name);
    CHECK(fi_getname(&ep->fid, name, &len) == 0 && len > 1 && name[len - 1] == '\0');
    CHECK(strlen(name) == len - 1);
    size_t small = 1;
    CHECK(fi_getname(&ep->fid, name, &small) == -FI_ETOOSMALL && small == len);
    fi_addr_t self;
    CHECK(fi_av_insert(av, name, 1, &self, 0, NULL) == 1);

    /* What is not translated answers -FI_ENOSYS, through a non-null slot. */
    CHECK(fi_connect(ep, name, NULL, 0) == -FI_ENOSYS);
    /* Translated slots check their arguments: a vector that is not there, an fi_datatype
       value that does not exist. */
    CHECK(fi_readv(ep, NULL, NULL, 1, self, 0, 0, NULL) == -FI_EINVAL);
    CHECK(fi_writev(ep, NULL, NULL, 1, self, 0, 0, NULL) == -FI_EINVAL);
    CHECK(fi_atomic(ep, buf, 1, NULL, self, 0, 0, 99, FI_SUM, NULL) == -FI_EINVAL);
    /* EQ errors: none queued; the error texts, into the caller's buffer (cut to its size). */
    struct fi_eq_err_entry eq_err;
    CHECK(fi_eq_readerr(eq, &eq_err, 0) == -FI_EAGAIN);
    char text[64], tiny[4];
    CHECK(fi_eq_strerror(eq, FI_ETRUNC, NULL, text, sizeof text) == text);
    CHECK(strcmp(text, fi_strerror(FI_ETRUNC)) == 0);
    CHECK(fi_cq_strerror(cq, FI_ETRUNC, NULL, tiny, sizeof tiny) == tiny);
    CHECK(strlen(tiny) == 3 && strncmp(tiny, fi_strerror(FI_ETRUNC), 3) == 0);
    CHECK(strcmp(fi_cq_strerror(cq, FI_ETRUNC, NULL, NULL, 0), fi_strerror(FI_ETRUNC)) == 0);
    /* Nothing posted with that context. */
    CHECK(fi_cancel(&ep->fid, &ctx) == -FI_ENOENT);

    /* A send to ourselves, read back as a tagged-format entry. */
    CHECK(fi_recv(ep, buf + 2048, 64, fi_mr_desc(mr), FI_ADDR_UNSPEC, &ctx) == 0);
    strcpy(buf, "hello");
    CHECK(fi_send(ep, buf, 6, fi_mr_desc(mr), self, buf) == 0);
    int got = 0;
    for (int i = 0; i < 1000000 && got < 2; i++) {
        ssize_t n = fi_cq_read(cq, &e, 1);
        if (n == 1) got++;
        else CHECK(n == -FI_EAGAIN);
    }
    CHECK(got == 2 && strcmp(buf + 2048, "hello") == 0);

    /* Two segments each way, tagged: "abc" + "def" lands split as "ab" + "cdef". */
    struct iovec tx[2] = { { "abc", 3 }, { "def", 4 } };
    struct iovec rx[2] = { { buf + 3000, 2 }, { buf + 3100, 16 } };
    CHECK(fi_trecvv(ep, rx, NULL, 2, FI_ADDR_UNSPEC, 7, 0, &ctx) == 0);
    CHECK(fi_tsendv(ep, tx, NULL, 2, self, 7, buf) == 0);
    got = 0;
    for (int i = 0; i < 1000000 && got < 2; i++) {
        ssize_t n = fi_cq_read(cq, &e, 1);
        if (n == 1) { got++; if (e.op_context == &ctx) CHECK(e.len == 7 && e.tag == 7); }
        else CHECK(n == -FI_EAGAIN);
    }
    CHECK(got == 2 && memcmp(buf + 3000, "ab", 2) == 0 && strcmp(buf + 3100, "cdef") == 0);

    /* A CQ with an endpoint bound refuses to close; after the endpoint it closes. */
    CHECK(fi_close(&cq->fid) == -FI_EBUSY);
    CHECK(fi_close(&ep->fid) == 0);
    CHECK(fi_close(&mr->fid) == 0);
    CHECK(fi_close(&cq->fid) == 0);
    CHECK(fi_close(&cntr->fid) == 0);
    CHECK(fi_close(&av->fid) == 0);
    CHECK(fi_close(&eq->fid) == 0);
    CHECK(fi_close(&domain->fid) == 0);
    CHECK(fi_close(&fabric->fid) == 0);
    fi_freeinfo(info);
    fi_freeinfo(hints);
    printf("ok\n");
    return 0;
}
"#;

const RMA_C: &str = r#"
#include <stdio.h>
#include <string.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_errno.h>

#define CHECK(c) do { if (!(c)) { printf("FAILED: %s line %d\n", #c, __LINE__); return 1; } } while (0)

static struct fid_cq *cq;

/* A post, tried again while it answers -FI_EAGAIN (which any post may: fi_endpoint(3)), the
 * queue driven meanwhile (no operation is outstanding at any post here: nothing is read that
 * a wait_one expects); any other answer but 0 fails, saying which. */
#define POST(call) do { \
    ssize_t rc_; int tries_ = 0; \
    while ((rc_ = (call)) == -FI_EAGAIN && tries_++ < 1000000) { \
        struct fi_cq_data_entry e_; (void)fi_cq_read(cq, &e_, 1); } \
    if (rc_ != 0) { printf("FAILED: %s = %zd line %d\n", #call, rc_, __LINE__); return 1; } \
} while (0)

static int wait_one(void) {
    struct fi_cq_data_entry e;
    for (int i = 0; i < 10000000; i++) {
        ssize_t n = fi_cq_read(cq, &e, 1);
        if (n == 1) return 0;
        if (n != -FI_EAGAIN) return (int)n;
    }
    return -1;
}

int main(void) {
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    hints->fabric_attr->prov_name = strdup("shm");
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_RMA;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_LOCAL;
    CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0);
    struct fid_fabric *fabric; struct fid_domain *domain; struct fid_ep *ep;
    struct fid_av *av; struct fid_mr *mr;
    CHECK(fi_fabric(info->fabric_attr, &fabric, NULL) == 0);
    CHECK(fi_domain(fabric, info, &domain, NULL) == 0);
    struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA };
    CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL) == 0);
    struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
    CHECK(fi_av_open(domain, &av_attr, &av, NULL) == 0);
    static char target[256], src[256], back[256];
    CHECK(fi_mr_reg(domain, target, sizeof target, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL) == 0);
    CHECK(fi_endpoint(domain, info, &ep, NULL) == 0);
    CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) == 0);
    CHECK(fi_ep_bind(ep, &av->fid, 0) == 0);
    CHECK(fi_enable(ep) == 0);
    char name[256]; size_t len = sizeof name;
    CHECK(fi_getname(&ep->fid, name, &len) == 0);
    fi_addr_t self;
    CHECK(fi_av_insert(av, name, 1, &self, 0, NULL) == 1);
    uint64_t base = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)target : 0;
    uint64_t key = fi_mr_key(mr);

    strcpy(src, "written through C");
    POST(fi_write(ep, src, 18, NULL, self, base, key, src));
    CHECK(wait_one() == 0);
    CHECK(strcmp(target, "written through C") == 0);
    POST(fi_read(ep, back, 18, NULL, self, base, key, back));
    CHECK(wait_one() == 0);
    CHECK(strcmp(back, "written through C") == 0);
    POST(fi_inject_write(ep, "inj", 4, self, base + 32, key));
    /* Read after write is ordered (FI_ORDER_RAW): the read sees the injected bytes. */
    POST(fi_read(ep, back + 32, 4, NULL, self, base + 32, key, back));
    CHECK(wait_one() == 0);
    CHECK(strcmp(back + 32, "inj") == 0);
    /* Vectors: two segments written into one remote span, read back into two others. */
    struct iovec wv[2] = { { "vec", 3 }, { "tor", 4 } };
    POST(fi_writev(ep, wv, NULL, 2, self, base + 64, key, NULL));
    CHECK(wait_one() == 0);
    CHECK(strcmp(target + 64, "vector") == 0);
    char h[3], t[4];
    struct iovec rv[2] = { { h, 3 }, { t, 4 } };
    POST(fi_readv(ep, rv, NULL, 2, self, base + 64, key, NULL));
    CHECK(wait_one() == 0);
    CHECK(memcmp(h, "vec", 3) == 0 && strcmp(t, "tor") == 0);
    /* A wrong key is the core's error, reported, never a crash. */
    ssize_t bad = fi_write(ep, src, 4, NULL, self, base, key + 12345, NULL);
    if (bad == 0) { struct fi_cq_err_entry err = {0}; CHECK(wait_one() == -FI_EAVAIL); CHECK(fi_cq_readerr(cq, &err, 0) == 1); }
    else CHECK(bad < 0);

    CHECK(fi_close(&ep->fid) == 0);
    CHECK(fi_close(&mr->fid) == 0);
    CHECK(fi_close(&cq->fid) == 0 && fi_close(&av->fid) == 0);
    CHECK(fi_close(&domain->fid) == 0 && fi_close(&fabric->fid) == 0);
    fi_freeinfo(info);
    fi_freeinfo(hints);
    printf("ok\n");
    return 0;
}
"#;

#[test]
fn c_program_writes_and_reads_its_own_memory_by_rma() {
    if !have_toolchain() {
        return;
    }
    assert_eq!(run_c("rma", RMA_C, true).trim(), "ok");
}

#[test]
fn c_program_opens_uses_and_closes_every_object() {
    if !have_toolchain() {
        return;
    }
    assert_eq!(run_c("objects", OBJECTS_C, true).trim(), "ok");
}

/// A fid of another class, or null, where a domain is expected: -FI_EINVAL, nothing called.
#[test]
fn wrong_class_and_null_fids_are_einval() {
    let mut fab: *mut c_void = null_mut();
    let attr = fabric::info::FiFabricAttr {
        fabric: null_mut(),
        name: null_mut(),
        prov_name: c"shm".as_ptr().cast_mut(),
        prov_version: 0,
        api_version: 0,
    };
    // SAFETY (whole test): pointers are ours and valid, or deliberately of the wrong class.
    unsafe {
        assert_eq!(
            fabric::fi_fabric((&raw const attr).cast_mut(), &mut fab, null_mut()),
            0
        );
        let head = &*fab.cast::<FabricHead>();
        let fops = &*head.ops;
        let mut out: *mut c_void = null_mut();
        // The fabric's own fid given as a domain's, and null.
        let cq_attr = FiCqAttr {
            size: 4,
            flags: 0,
            format: 0,
            wait_obj: 0,
            signaling_vector: 0,
            wait_cond: 0,
            wait_set: null_mut(),
        };
        let domain_ops = {
            // Reach the translated domain ops through a real domain.
            let mut h = null_mut();
            let mut info = null_mut();
            let hints = fabric::fi_dupinfo(null());
            (*(*hints).fabric_attr).prov_name = libc::strdup(c"shm".as_ptr());
            assert_eq!(
                fabric::fi_getinfo((1 << 16) | 17, null(), null(), 0, hints, &mut info),
                0
            );
            assert_eq!((fops.domain)(fab, info.cast(), &mut h, null_mut()), 0);
            fabric::fi_freeinfo(info);
            fabric::fi_freeinfo(hints);
            h
        };
        let dhead = &*domain_ops.cast::<DomainHead>();
        let dops = &*dhead.ops;
        let a = (&raw const cq_attr).cast_mut().cast::<c_void>();
        assert_eq!((dops.cq_open)(fab, a, &mut out, null_mut()), -libc::EINVAL);
        assert_eq!(
            (dops.cq_open)(null_mut(), a, &mut out, null_mut()),
            -libc::EINVAL
        );
        assert_eq!(
            (dops.cq_open)(domain_ops, a, null_mut(), null_mut()),
            -libc::EINVAL
        );
        assert_eq!(
            (dops.cq_open)(domain_ops, null_mut(), &mut out, null_mut()),
            -libc::EINVAL
        );
        assert!(out.is_null());
        // A bad enum in an attribute.
        let bad = FiCqAttr {
            format: 42,
            ..cq_attr
        };
        let b = (&raw const bad).cast_mut().cast::<c_void>();
        assert_eq!(
            (dops.cq_open)(domain_ops, b, &mut out, null_mut()),
            -libc::EINVAL
        );
        // The domain's close refuses the fabric's fid, then each closes its own.
        let dfid = &*domain_ops.cast::<Fid>();
        let close: unsafe extern "C" fn(*mut c_void) -> c_int = (*dfid.ops).close;
        assert_eq!(close(fab), -libc::EINVAL);
        assert_eq!(close(domain_ops), 0);
        let ffid = &*fab.cast::<Fid>();
        assert_eq!(((*ffid.ops).close)(fab), 0);
    }
}
