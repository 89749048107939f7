# Writes capi/src/ops.rs from the fi_ops_* declarations in /usr/include/rdma (libfabric-dev):
#   python3 capi/tools/gen_ops.py capi/src/ops.rs && cargo fmt --all
# Types are facts of the C ABI: every pointer becomes a void pointer, enums c_int.
import re, glob, sys
src=''
for f in sorted(glob.glob('/usr/include/rdma/*.h')):
    src+=open(f).read()+'\n'
src=re.sub(r'/\*.*?\*/','',src,flags=re.S)
names=['fi_ops','fi_ops_fabric','fi_ops_domain','fi_ops_mr','fi_ops_av','fi_ops_cq','fi_ops_cntr','fi_ops_eq','fi_ops_wait','fi_ops_ep','fi_ops_msg','fi_ops_tagged','fi_ops_rma','fi_ops_atomic','fi_ops_cm']
def rty(t):
    t=t.strip()
    t=re.sub(r'\s+',' ',t)
    if t.count('*') >= 2:
        return '*mut *mut c_void'
    if '*' in t or t.endswith('fid_t'):
        return '*const c_void' if t.startswith('const') else '*mut c_void'
    t=t.replace('const ','').replace('enum ','ENUM ')
    m={'size_t':'usize','ssize_t':'isize','int':'c_int','uint64_t':'u64','fi_addr_t':'u64','uint32_t':'u32','void':'()','char':'c_char'}
    if t.startswith('ENUM '): return 'c_int'
    return m[t]
def camel(n):
    return ''.join(p.capitalize() for p in n.split('_'))
out=[]
for n in names:
    body=re.search(r'struct '+n+r' \{(.*?)\n\};',src,re.S).group(1)
    body=re.sub(r'#ifdef.*?#endif','',body,flags=re.S)
    decls=[d.strip() for d in body.split(';') if d.strip()]
    assert re.sub(r'\s+',' ',decls[0])=='size_t size',decls[0]
    members=[]
    for d in decls[1:]:
        d=re.sub(r'\s+',' ',d)
        m=re.match(r'(.*?)\(\*(\w+)\)\s*\((.*)\)$',d)
        assert m,d
        ret,name,args=m.groups()
        ret=ret.strip()
        rr = '*const c_char' if ret=='const char *' else rty(ret)
        argl=[]
        for a in args.split(','):
            a=a.strip()
            if a=='void': continue
            # strip the arg name
            mm=re.match(r'(.*?)(\w+)(\[\])?$',a)
            ty=mm.group(1).strip()
            if mm.group(3): ty+=' *'
            if ty=='' : ty=a
            argl.append(rty(ty))
        members.append((name,rr,argl))
    out.append((n,members))
# emit
r=[]
r.append('// Generated from the fi_ops_* declarations of libfabric 1.17\'s headers (member order and\n// C types); regenerate rather than edit. Every member defaults to a function of its signature\n// answering -FI_ENOSYS (null or an empty string where it returns a pointer).\n')
r.append('use std::ffi::{c_char, c_int, c_void};\n\nuse crate::consts::FI_ENOSYS;\n')
r.append('''/// A function of the given signature that ignores its arguments and answers `$v`.
macro_rules! stub {
    (($($a:ty),*) -> $r:ty = $v:expr) => {{
        unsafe extern "C" fn f($(_: $a),*) -> $r {
            $v
        }
        f
    }};
}''')
for n,members in out:
    cn=camel(n)
    r.append(f'\n/// `struct {n}`.\n#[repr(C)]\n#[derive(Clone, Copy)]\npub struct {cn} {{\n    pub size: usize,')
    for name,rr,argl in members:
        fld='type_' if name=='type' else name
        ret='' if rr=='()' else f' -> {rr}'
        r.append(f'    pub {fld}: unsafe extern "C" fn({", ".join(argl)}){ret},')
    r.append('}')
    r.append(f'\nimpl {cn} {{\n    /// Every member answering -FI_ENOSYS.\n    pub const ENOSYS: Self = Self {{\n        size: size_of::<Self>(),')
    for name,rr,argl in members:
        fld='type_' if name=='type' else name
        r.append(f'        {fld}: stub!(({", ".join(argl)}) -> {rr if rr != "()" else "()"} = BODY_{rr}),')
    r.append('    };\n}')
s='\n'.join(r)
bodies={'c_int':'-FI_ENOSYS','isize':'-(FI_ENOSYS as isize)','*const c_char':'c"".as_ptr()','u64':'0','*mut c_void':'std::ptr::null_mut()','()':'()','usize':'0'}
for k,v in bodies.items():
    s=s.replace('BODY_'+k+')',v+')')
assert 'BODY_' not in s, re.findall(r'BODY_\S+',s)
open(sys.argv[1],'w').write(s+'\n')
