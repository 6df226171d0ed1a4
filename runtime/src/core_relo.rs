//! CO-RE relocations: the `core_relo` records of `.BTF.ext`, resolved as libbpf resolves them
//! (`relo_core.c`) and applied to the linked code.
//!
//! clang records every access through a `preserve_access_index` type (and every
//! `__builtin_preserve_field_info` / `_type_info` / `_enum_value`) as
//! `struct bpf_core_relo { u32 insn_off, type_id, access_str_off, kind; }`, grouped by code
//! section. The access string `"0:1:2"` indexes the root pointer, then members / array
//! elements of the local type (the object's `.BTF`). Resolution finds the *candidates* of the
//! root type in the target BTF (same kind, same name ignoring a `___flavour` suffix), matches
//! the access on each (members by name, through anonymous members, with compatible kinds;
//! array indices in bounds) and computes the value for the relocation's kind; all matching
//! candidates must agree. The instruction is then patched as `bpf_core_patch_insn` does: an
//! ALU/ALU64 immediate, a load/store offset (with the access size adjusted when an unsigned
//! integer or pointer field changed size), or an `lddw` immediate, each first checked to hold
//! the value the local BTF gives (except where libbpf does not check: bitfields, type ids).
//!
//! Without a target BTF the target is the local type itself: every relocation resolves to
//! its local value. A relocation nothing in the target satisfies gives 0 for the
//! `*_EXISTS` kinds and for the type kinds (as libbpf); for the others the instruction is
//! *poisoned* as libbpf poisons it: replaced by `call 0xbad2310` ([`POISON_HELPER`], both
//! slots of an `lddw`). A program whose code can reach a poisoned instruction is refused
//! when it is loaded, with an error naming section, instruction, kind, access and why; one
//! that guards the access (`if (bpf_core_field_exists(...))`, a constant after relocation)
//! loads and runs, as under libbpf and the kernel's verifier (the runtime's `poison` module).
//!
//! Every malformed input (records, access strings, type ids, loops in either BTF) is an
//! error; the recursive matches are bounded by a step budget, so no input panics or runs away.

use super::btf::{Btf, BtfMember, BtfType};

/// `btf_ext_header.magic`.
pub const BTF_EXT_MAGIC: u16 = 0xeb9f;

/// `enum bpf_core_relo_kind`.
pub mod kind {
    /// Field byte offset.
    pub const FIELD_BYTE_OFFSET: u32 = 0;
    /// Field size in bytes.
    pub const FIELD_BYTE_SIZE: u32 = 1;
    /// Field exists (1 / 0).
    pub const FIELD_EXISTS: u32 = 2;
    /// Field is a signed integer or enum.
    pub const FIELD_SIGNED: u32 = 3;
    /// Left shift extracting a bitfield from a u64.
    pub const FIELD_LSHIFT_U64: u32 = 4;
    /// Right shift extracting a bitfield from a u64.
    pub const FIELD_RSHIFT_U64: u32 = 5;
    /// Type id in the local BTF.
    pub const TYPE_ID_LOCAL: u32 = 6;
    /// Type id in the target BTF.
    pub const TYPE_ID_TARGET: u32 = 7;
    /// Type exists (1 / 0).
    pub const TYPE_EXISTS: u32 = 8;
    /// Type size in bytes.
    pub const TYPE_SIZE: u32 = 9;
    /// Enumerator exists (1 / 0).
    pub const ENUMVAL_EXISTS: u32 = 10;
    /// Enumerator value.
    pub const ENUMVAL_VALUE: u32 = 11;
    /// Type matches (libbpf's stricter relation, 1 / 0).
    pub const TYPE_MATCHES: u32 = 12;
}

const KIND_NAMES: [&str; 13] = [
    "FIELD_BYTE_OFFSET",
    "FIELD_BYTE_SIZE",
    "FIELD_EXISTS",
    "FIELD_SIGNED",
    "FIELD_LSHIFT_U64",
    "FIELD_RSHIFT_U64",
    "TYPE_ID_LOCAL",
    "TYPE_ID_TARGET",
    "TYPE_EXISTS",
    "TYPE_SIZE",
    "ENUMVAL_EXISTS",
    "ENUMVAL_VALUE",
    "TYPE_MATCHES",
];

/// Name of a relocation kind, for messages.
pub fn kind_name(k: u32) -> String {
    KIND_NAMES
        .get(k as usize)
        .map_or_else(|| format!("unknown kind {k}"), |n| format!("{n} ({k})"))
}

/// libbpf's `BPF_CORE_SPEC_MAX_LEN`: accessors in a spec.
const SPEC_MAX_LEN: usize = 64;
/// Steps of the recursive matches per relocation (member searches, compatibility checks).
const FUEL: u32 = 200_000;

/// One `bpf_core_relo` record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoreRelo {
    /// Index of the record in its section's list (for messages).
    pub index: usize,
    /// Byte offset of the instruction in its ELF section.
    pub insn_off: u32,
    /// Root type in the local BTF.
    pub type_id: u32,
    /// Offset of the access string in the local BTF's strings.
    pub access_str_off: u32,
    /// `bpf_core_relo_kind`.
    pub kind: u32,
}

/// The records of one ELF section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreSection {
    /// Offset of the section name in the local BTF's strings.
    pub name_off: u32,
    /// Records in file order.
    pub relos: Vec<CoreRelo>,
}

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    d.get(at..at.checked_add(4)?)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
}

/// The `core_relo` part of a `.BTF.ext` section (empty when the header has none). Errors
/// name the header field, or the info section and record index and field.
pub fn parse_btf_ext(d: &[u8]) -> Result<Vec<CoreSection>, String> {
    if d.len() < 8 {
        return Err(format!("truncated header ({} bytes, at least 8)", d.len()));
    }
    let magic = u16::from_le_bytes([d[0], d[1]]);
    if magic == BTF_EXT_MAGIC.swap_bytes() {
        return Err("big-endian BTF.ext is not supported".into());
    }
    if magic != BTF_EXT_MAGIC {
        return Err(format!(
            "header field `magic`: {magic:#06x} (expected {BTF_EXT_MAGIC:#06x})"
        ));
    }
    if d[2] != 1 {
        return Err(format!("header field `version`: {}, expected 1", d[2]));
    }
    let hdr_len = u32_at(d, 4).unwrap() as usize;
    if hdr_len < 24 || hdr_len > d.len() {
        return Err(format!(
            "header field `hdr_len`: {hdr_len} (at least 24, at most the section's {})",
            d.len()
        ));
    }
    // The core_relo fields are the header's optional part.
    if hdr_len < 32 {
        return Ok(Vec::new());
    }
    let (off, len) = (u32_at(d, 24).unwrap(), u32_at(d, 28).unwrap());
    if len == 0 {
        return Ok(Vec::new());
    }
    let body = &d[hdr_len..];
    let part = (off as usize)
        .checked_add(len as usize)
        .and_then(|e| body.get(off as usize..e))
        .ok_or_else(|| {
            format!(
                "header fields `core_relo_off`/`core_relo_len` = {off:#x}/{len:#x}: outside the section ({} bytes after the header)",
                body.len()
            )
        })?;
    let rec_size = u32_at(part, 0)
        .ok_or_else(|| format!("core_relo field `rec_size`: truncated ({len} bytes)"))?
        as usize;
    if rec_size < 16 || rec_size % 4 != 0 {
        return Err(format!(
            "core_relo field `rec_size`: {rec_size} (a bpf_core_relo is 16 bytes; a multiple of 4 at least that)"
        ));
    }
    let mut out = Vec::new();
    let mut pos = 4;
    while pos < part.len() {
        let si = out.len();
        let field = |f: &str, at: usize| {
            u32_at(part, at).ok_or_else(|| {
                format!("core_relo info #{si} field `{f}`: truncated (the core_relo part ends)")
            })
        };
        let name_off = field("sec_name_off", pos)?;
        let n = field("num_info", pos + 4)? as usize;
        pos += 8;
        if n == 0 {
            return Err(format!("core_relo info #{si} field `num_info`: 0 records"));
        }
        let need = n.checked_mul(rec_size);
        if need.is_none_or(|b| b > part.len() - pos) {
            return Err(format!(
                "core_relo info #{si} field `num_info`: {n} records of {rec_size} bytes run past the core_relo part ({} bytes left)",
                part.len() - pos
            ));
        }
        let mut relos = Vec::with_capacity(n);
        for index in 0..n {
            let r = pos + index * rec_size;
            let w = |i: usize| u32_at(part, r + 4 * i).unwrap();
            relos.push(CoreRelo {
                index,
                insn_off: w(0),
                type_id: w(1),
                access_str_off: w(2),
                kind: w(3),
            });
        }
        pos += n * rec_size;
        out.push(CoreSection { name_off, relos });
    }
    Ok(out)
}

/// Checks what does not need the BTF: kind and instruction alignment. `Err(field, why)`.
pub fn check_record(r: &CoreRelo) -> Result<(), (&'static str, String)> {
    if r.kind as usize >= KIND_NAMES.len() {
        return Err(("kind", format!("unknown kind {}", r.kind)));
    }
    if r.insn_off % 8 != 0 {
        return Err((
            "insn_off",
            format!("{:#x} is not at an instruction boundary", r.insn_off),
        ));
    }
    Ok(())
}

fn field_based(k: u32) -> bool {
    k <= kind::FIELD_RSHIFT_U64
}

fn type_based(k: u32) -> bool {
    matches!(
        k,
        kind::TYPE_ID_LOCAL
            | kind::TYPE_ID_TARGET
            | kind::TYPE_EXISTS
            | kind::TYPE_SIZE
            | kind::TYPE_MATCHES
    )
}

fn enum_based(k: u32) -> bool {
    matches!(k, kind::ENUMVAL_EXISTS | kind::ENUMVAL_VALUE)
}

/// Length of a name without its flavour: `task___v2` → `task` (libbpf: the last `X___Y`
/// where neither X nor Y is an underscore).
pub fn essential_name(name: &str) -> &str {
    let b = name.as_bytes();
    let n = b.len();
    for i in (0..n.saturating_sub(4)).rev() {
        if b[i] != b'_' && &b[i + 1..i + 4] == b"___" && b[i + 4] != b'_' {
            return &name[..i + 1];
        }
    }
    name
}

/// One high-level accessor: a named member (`type_id` is the struct / union, `idx` the
/// member) or an array index (`type_id` is the element type).
#[derive(Clone, Debug)]
struct Acc {
    type_id: u32,
    idx: u32,
    name: Option<String>,
}

/// A parsed access on one BTF.
#[derive(Clone, Debug, Default)]
struct Spec {
    root: u32,
    raw: Vec<u32>,
    acc: Vec<Acc>,
    bit_offset: u64,
}

fn is_composite(t: &BtfType) -> bool {
    matches!(t, BtfType::Struct { .. } | BtfType::Union { .. })
}

fn is_enum(t: &BtfType) -> bool {
    matches!(t, BtfType::Enum { .. } | BtfType::Enum64 { .. })
}

fn kind_compat(a: &BtfType, b: &BtfType) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b) || (is_enum(a) && is_enum(b))
}

fn members(t: &BtfType) -> &[BtfMember] {
    match t {
        BtfType::Struct { members, .. } | BtfType::Union { members, .. } => members,
        _ => &[],
    }
}

fn enumerators(t: &BtfType) -> Vec<(&str, u64)> {
    match t {
        BtfType::Enum { values, .. } => values
            .iter()
            .map(|(n, v)| (n.as_str(), *v as u64))
            .collect(),
        BtfType::Enum64 { values, .. } => values.iter().map(|(n, v)| (n.as_str(), *v)).collect(),
        _ => Vec::new(),
    }
}

/// `struct x`, `union x`, `enum x`, `typedef x`, `INT x`... for messages.
fn describe(t: &BtfType) -> String {
    let k = match t {
        BtfType::Struct { .. } => "struct",
        BtfType::Union { .. } => "union",
        BtfType::Enum { .. } | BtfType::Enum64 { .. } => "enum",
        BtfType::Typedef { .. } => "typedef",
        BtfType::Fwd { union: true, .. } => "union (forward)",
        BtfType::Fwd { .. } => "struct (forward)",
        other => other.kind_name(),
    };
    let n = t.name();
    if n.is_empty() {
        format!("{k} <anon>")
    } else {
        format!("{k} {n}")
    }
}

struct Resolver<'a> {
    local: &'a Btf,
    target: Option<&'a Btf>,
    fuel: u32,
}

fn e2s(e: crate::Error) -> String {
    e.message
}

impl Resolver<'_> {
    fn burn(&mut self) -> Result<(), String> {
        self.fuel = self
            .fuel
            .checked_sub(1)
            .ok_or("the type graph is too large or cyclic to match (step budget exhausted)")?;
        Ok(())
    }
}

fn resolved(btf: &Btf, id: u32) -> Result<(u32, &BtfType), String> {
    let r = btf.resolve(id).map_err(e2s)?;
    Ok((r, btf.get(r).map_err(e2s)?))
}

fn size(btf: &Btf, id: u32) -> Result<u64, String> {
    btf.size_of(id).map_err(e2s)
}

fn is_flex(btf: &Btf, acc: Option<&Acc>, nelems: u32) -> bool {
    let Some(acc) = acc else { return false };
    if acc.name.is_none() || nelems > 0 {
        return false;
    }
    btf.get(acc.type_id)
        .is_ok_and(|t| acc.idx as usize + 1 == members(t).len())
}

fn bits(idx: u32, sz: u64) -> Result<u64, String> {
    u64::from(idx)
        .checked_mul(sz)
        .and_then(|v| v.checked_mul(8))
        .ok_or_else(|| "offset overflows".to_string())
}

/// libbpf's `bpf_core_parse_spec` on the local BTF.
fn parse_spec(btf: &Btf, r: &CoreRelo, access: &str) -> Result<Spec, String> {
    if access.is_empty() || access.starts_with(':') {
        return Err(format!("access string `{access}` is empty"));
    }
    let mut spec = Spec {
        root: r.type_id,
        ..Spec::default()
    };
    btf.get(r.type_id).map_err(e2s)?;
    if type_based(r.kind) {
        if access != "0" {
            return Err(format!(
                "access string `{access}` of a type relocation (must be `0`)"
            ));
        }
        return Ok(spec);
    }
    for part in access.split(':') {
        let v: u32 = part
            .parse()
            .map_err(|_| format!("access string `{access}`: `{part}` is not an index"))?;
        if spec.raw.len() == SPEC_MAX_LEN {
            return Err(format!(
                "access string `{access}`: more than {SPEC_MAX_LEN} accessors"
            ));
        }
        spec.raw.push(v);
    }
    let (mut id, t) = resolved(btf, r.type_id)?;
    let first = spec.raw[0];
    if enum_based(r.kind) {
        let en = enumerators(t);
        let Some((name, _)) = en.get(first as usize) else {
            return Err(format!(
                "access string `{access}`: not an enumerator of {}",
                describe(t)
            ));
        };
        if spec.raw.len() > 1 {
            return Err(format!(
                "access string `{access}` of an enum relocation has more than one index"
            ));
        }
        spec.acc.push(Acc {
            type_id: id,
            idx: first,
            name: Some(name.to_string()),
        });
        return Ok(spec);
    }
    spec.acc.push(Acc {
        type_id: id,
        idx: first,
        name: None,
    });
    spec.bit_offset = bits(first, size(btf, id)?)?;
    for i in 1..spec.raw.len() {
        let (rid, t) = resolved(btf, id)?;
        id = rid;
        let idx = spec.raw[i];
        if is_composite(t) {
            let m = members(t).get(idx as usize).ok_or_else(|| {
                format!(
                    "access string `{access}` index {i}: {} has {} members",
                    describe(t),
                    members(t).len()
                )
            })?;
            spec.bit_offset = spec
                .bit_offset
                .checked_add(u64::from(m.bit_offset))
                .ok_or("offset overflows")?;
            if !m.name.is_empty() {
                spec.acc.push(Acc {
                    type_id: id,
                    idx,
                    name: Some(m.name.clone()),
                });
            }
            id = m.type_id;
        } else if let BtfType::Array { elem, nelems, .. } = t {
            let flex = is_flex(btf, spec.acc.last(), *nelems);
            let (eid, _) = resolved(btf, *elem)?;
            if !flex && idx >= *nelems {
                return Err(format!(
                    "access string `{access}` index {i}: {idx} is past the array's {nelems} elements"
                ));
            }
            id = eid;
            spec.acc.push(Acc {
                type_id: id,
                idx,
                name: None,
            });
            spec.bit_offset = spec
                .bit_offset
                .checked_add(bits(idx, size(btf, id)?)?)
                .ok_or("offset overflows")?;
        } else {
            return Err(format!(
                "access string `{access}` index {i}: {} is neither a struct, a union nor an array",
                describe(t)
            ));
        }
    }
    Ok(spec)
}

/// `struct pj_task.comm[2]`, `enum e::V`, `struct pj_task`: the local access, for messages.
fn describe_spec(btf: &Btf, k: u32, spec: &Spec) -> String {
    let root = btf
        .get(spec.root)
        .map_or_else(|_| format!("[{}]", spec.root), describe);
    if type_based(k) {
        return root;
    }
    if enum_based(k) {
        let n = spec
            .acc
            .first()
            .and_then(|a| a.name.as_deref())
            .unwrap_or("?");
        return format!("{root}::{n}");
    }
    let mut s = root;
    for (i, a) in spec.acc.iter().enumerate() {
        match &a.name {
            Some(n) => {
                s.push('.');
                s.push_str(n);
            }
            None if i > 0 || a.idx > 0 => s.push_str(&format!("[{}]", a.idx)),
            None => {}
        }
    }
    s
}

/// Why a candidate does not match (or it does).
enum Match {
    Yes(Spec),
    No(String),
}

enum Member {
    Found(u32),
    Incompatible(String),
    NotFound,
}

impl Resolver<'_> {
    /// libbpf's `bpf_core_fields_are_compat`.
    fn fields_compat(&mut self, mut lid: u32, tb: &Btf, mut tid: u32) -> Result<bool, String> {
        let lb = self.local;
        loop {
            self.burn()?;
            let (_, lt) = resolved(lb, lid)?;
            let (_, tt) = resolved(tb, tid)?;
            if is_composite(lt) && is_composite(tt) {
                return Ok(true);
            }
            if !kind_compat(lt, tt) {
                return Ok(false);
            }
            return Ok(match (lt, tt) {
                (BtfType::Ptr { .. }, _) | (BtfType::Float { .. }, _) => true,
                (BtfType::Fwd { .. }, _)
                | (BtfType::Enum { .. }, _)
                | (BtfType::Enum64 { .. }, _) => {
                    let (a, b) = (essential_name(lt.name()), essential_name(tt.name()));
                    a.is_empty() || b.is_empty() || a == b
                }
                (BtfType::Int { offset: a, .. }, BtfType::Int { offset: b, .. }) => {
                    *a == 0 && *b == 0
                }
                (BtfType::Array { elem: a, .. }, BtfType::Array { elem: b, .. }) => {
                    (lid, tid) = (*a, *b);
                    continue;
                }
                _ => false,
            });
        }
    }

    /// libbpf's `bpf_core_match_member`: the local named accessor `la` in target composite
    /// `tid`, through anonymous members.
    fn match_member(
        &mut self,
        la: &Acc,
        tb: &Btf,
        tid: u32,
        spec: &mut Spec,
    ) -> Result<Member, String> {
        self.burn()?;
        let (tid, tt) = resolved(tb, tid)?;
        if !is_composite(tt) {
            return Ok(Member::NotFound);
        }
        let lt = self.local.get(la.type_id).map_err(e2s)?;
        let lm = members(lt)
            .get(la.idx as usize)
            .ok_or("accessor outside its struct")?
            .clone();
        for (i, m) in members(tt).iter().enumerate() {
            if spec.raw.len() == SPEC_MAX_LEN {
                return Err(format!(
                    "more than {SPEC_MAX_LEN} nested members in the target"
                ));
            }
            spec.bit_offset += u64::from(m.bit_offset);
            spec.raw.push(i as u32);
            if m.name.is_empty() {
                match self.match_member(la, tb, m.type_id, spec)? {
                    Member::NotFound => {}
                    found => return Ok(found),
                }
            } else if m.name == lm.name {
                spec.acc.push(Acc {
                    type_id: tid,
                    idx: i as u32,
                    name: Some(m.name.clone()),
                });
                if self.fields_compat(lm.type_id, tb, m.type_id)? {
                    return Ok(Member::Found(m.type_id));
                }
                spec.acc.pop();
                let lk = resolved(self.local, lm.type_id).map(|(_, t)| describe(t))?;
                let tk = resolved(tb, m.type_id).map(|(_, t)| describe(t))?;
                return Ok(Member::Incompatible(format!(
                    "member `{}` of target {} is {tk}, incompatible with the local {lk}",
                    m.name,
                    describe(tt)
                )));
            }
            spec.bit_offset -= u64::from(m.bit_offset);
            spec.raw.pop();
        }
        Ok(Member::NotFound)
    }

    /// libbpf's `__bpf_core_types_are_compat`.
    fn types_compat(&mut self, lid: u32, tb: &Btf, tid: u32, level: u32) -> Result<bool, String> {
        let lb = self.local;
        if !kind_compat(lb.get(lid).map_err(e2s)?, tb.get(tid).map_err(e2s)?) {
            return Ok(false);
        }
        let (mut lid, mut tid) = (lid, tid);
        for _ in 0..32 {
            self.burn()?;
            let (_, lt) = resolved(lb, lid)?;
            let (_, tt) = resolved(tb, tid)?;
            if !kind_compat(lt, tt) {
                return Ok(false);
            }
            match (lt, tt) {
                (BtfType::Void, _)
                | (BtfType::Struct { .. }, _)
                | (BtfType::Union { .. }, _)
                | (BtfType::Enum { .. }, _)
                | (BtfType::Enum64 { .. }, _)
                | (BtfType::Fwd { .. }, _) => return Ok(true),
                (BtfType::Int { offset: a, .. }, BtfType::Int { offset: b, .. }) => {
                    return Ok(*a == 0 && *b == 0)
                }
                (BtfType::Ptr { type_id: a }, BtfType::Ptr { type_id: b }) => (lid, tid) = (*a, *b),
                (BtfType::Array { elem: a, .. }, BtfType::Array { elem: b, .. }) => {
                    (lid, tid) = (*a, *b)
                }
                (
                    BtfType::FuncProto {
                        ret: lr,
                        params: lp,
                    },
                    BtfType::FuncProto {
                        ret: tr,
                        params: tp,
                    },
                ) => {
                    if lp.len() != tp.len() {
                        return Ok(false);
                    }
                    for (a, b) in lp.iter().zip(tp) {
                        if level == 0 {
                            return Err("function prototypes nest too deeply".into());
                        }
                        let a = lb.resolve(a.type_id).map_err(e2s)?;
                        let b = tb.resolve(b.type_id).map_err(e2s)?;
                        if !self.types_compat(a, tb, b, level - 1)? {
                            return Ok(false);
                        }
                    }
                    (lid, tid) = (*lr, *tr);
                }
                _ => return Ok(false),
            }
        }
        Err("type chains nest too deeply (more than 32 levels)".into())
    }

    fn names_match(l: &str, t: &str) -> bool {
        if t.is_empty() {
            return l.is_empty();
        }
        essential_name(l) == essential_name(t)
    }

    /// libbpf's `__bpf_core_types_match` (TYPE_MATCHES).
    fn types_match(
        &mut self,
        lid: u32,
        tb: &Btf,
        tid: u32,
        mut behind_ptr: bool,
        level: u32,
    ) -> Result<bool, String> {
        let lb = self.local;
        if level == 0 {
            return Err("types nest too deeply".into());
        }
        let (mut lid, mut tid) = (lid, tid);
        for _ in 0..32 {
            self.burn()?;
            let (_, lt) = resolved(lb, lid)?;
            let (_, tt) = resolved(tb, tid)?;
            if !Self::names_match(lt.name(), tt.name()) {
                return Ok(false);
            }
            match lt {
                BtfType::Void => return Ok(matches!(tt, BtfType::Void)),
                BtfType::Fwd { union: lu, .. } => {
                    return Ok(match tt {
                        BtfType::Fwd { union: tu, .. } => lu == tu,
                        BtfType::Struct { .. } => behind_ptr && !lu,
                        BtfType::Union { .. } => behind_ptr && *lu,
                        _ => false,
                    })
                }
                BtfType::Enum { size: ls, .. } | BtfType::Enum64 { size: ls, .. } => {
                    let ts = match tt {
                        BtfType::Enum { size, .. } | BtfType::Enum64 { size, .. } => *size,
                        _ => return Ok(false),
                    };
                    let (le, te) = (enumerators(lt), enumerators(tt));
                    if *ls != ts || le.len() > te.len() {
                        return Ok(false);
                    }
                    return Ok(le
                        .iter()
                        .all(|(l, _)| te.iter().any(|(t, _)| Self::names_match(l, t))));
                }
                BtfType::Struct { .. } | BtfType::Union { .. } => {
                    let same = std::mem::discriminant(lt) == std::mem::discriminant(tt);
                    if behind_ptr {
                        return Ok(same
                            || matches!(tt, BtfType::Fwd { union, .. }
                                if *union == matches!(lt, BtfType::Union { .. })));
                    }
                    if !same || members(lt).len() > members(tt).len() {
                        return Ok(false);
                    }
                    for lm in members(lt) {
                        let mut matched = false;
                        for tm in members(tt) {
                            if Self::names_match(&lm.name, &tm.name)
                                && self.types_match(
                                    lm.type_id,
                                    tb,
                                    tm.type_id,
                                    behind_ptr,
                                    level - 1,
                                )?
                            {
                                matched = true;
                                break;
                            }
                        }
                        if !matched {
                            return Ok(false);
                        }
                    }
                    return Ok(true);
                }
                BtfType::Int {
                    size: ls,
                    encoding: le,
                    ..
                } => {
                    return Ok(matches!(tt, BtfType::Int { size, encoding, .. }
                        if size == ls && (encoding & 1) == (le & 1)))
                }
                BtfType::Ptr { type_id } => {
                    let BtfType::Ptr { type_id: t } = tt else {
                        return Ok(false);
                    };
                    behind_ptr = true;
                    (lid, tid) = (*type_id, *t);
                }
                BtfType::Array { elem, nelems, .. } => {
                    let BtfType::Array {
                        elem: te,
                        nelems: tn,
                        ..
                    } = tt
                    else {
                        return Ok(false);
                    };
                    if nelems != tn {
                        return Ok(false);
                    }
                    (lid, tid) = (*elem, *te);
                }
                BtfType::FuncProto { ret, params } => {
                    let BtfType::FuncProto {
                        ret: tr,
                        params: tp,
                    } = tt
                    else {
                        return Ok(false);
                    };
                    if params.len() != tp.len() {
                        return Ok(false);
                    }
                    for (a, b) in params.iter().zip(tp) {
                        if !self.types_match(a.type_id, tb, b.type_id, behind_ptr, level - 1)? {
                            return Ok(false);
                        }
                    }
                    (lid, tid) = (*ret, *tr);
                }
                _ => return Ok(false),
            }
        }
        Err("type chains nest too deeply (more than 32 levels)".into())
    }

    /// libbpf's `bpf_core_spec_match`: the local spec on target candidate `tid`.
    fn spec_match(&mut self, k: u32, local: &Spec, tb: &Btf, tid: u32) -> Result<Match, String> {
        let mut spec = Spec {
            root: tid,
            ..Spec::default()
        };
        if type_based(k) {
            let ok = if k == kind::TYPE_MATCHES {
                self.types_match(local.root, tb, tid, false, 32)?
            } else {
                self.types_compat(local.root, tb, tid, 32)?
            };
            return Ok(if ok {
                Match::Yes(spec)
            } else {
                Match::No(format!(
                    "target {} [{tid}] is not compatible",
                    describe(tb.get(tid).map_err(e2s)?)
                ))
            });
        }
        if enum_based(k) {
            let (rid, tt) = resolved(tb, tid)?;
            let lname = local.acc[0].name.as_deref().unwrap_or("");
            if !is_enum(tt) {
                return Ok(Match::No(format!("target {} is not an enum", describe(tt))));
            }
            for (i, (n, _)) in enumerators(tt).iter().enumerate() {
                if essential_name(n) == essential_name(lname) {
                    spec.acc.push(Acc {
                        type_id: rid,
                        idx: i as u32,
                        name: Some(n.to_string()),
                    });
                    spec.raw.push(i as u32);
                    return Ok(Match::Yes(spec));
                }
            }
            return Ok(Match::No(format!(
                "no enumerator `{lname}` in target {}",
                describe(tt)
            )));
        }
        let mut tid = tid;
        for (i, la) in local.acc.iter().enumerate() {
            let (rid, tt) = resolved(tb, tid)?;
            tid = rid;
            if let Some(name) = &la.name {
                match self.match_member(la, tb, tid, &mut spec)? {
                    Member::Found(next) => tid = next,
                    Member::Incompatible(why) => return Ok(Match::No(why)),
                    Member::NotFound => {
                        return Ok(Match::No(if is_composite(tt) {
                            format!("no member `{name}` in target {}", describe(tt))
                        } else {
                            format!(
                                "target {} has no members (looking for `{name}`)",
                                describe(tt)
                            )
                        }))
                    }
                }
            } else {
                if i > 0 {
                    let BtfType::Array { elem, nelems, .. } = tt else {
                        return Ok(Match::No(format!(
                            "target {} is not an array (index {})",
                            describe(tt),
                            la.idx
                        )));
                    };
                    let flex = is_flex(tb, spec.acc.last(), *nelems);
                    if !flex && la.idx >= *nelems {
                        return Ok(Match::No(format!(
                            "index {} is past the target array's {nelems} elements",
                            la.idx
                        )));
                    }
                    tid = resolved(tb, *elem)?.0;
                }
                if spec.raw.len() == SPEC_MAX_LEN {
                    return Err(format!("more than {SPEC_MAX_LEN} accessors in the target"));
                }
                spec.acc.push(Acc {
                    type_id: tid,
                    idx: la.idx,
                    name: None,
                });
                spec.raw.push(la.idx);
                spec.bit_offset = spec
                    .bit_offset
                    .checked_add(bits(la.idx, size(tb, tid)?)?)
                    .ok_or("offset overflows")?;
            }
        }
        Ok(Match::Yes(spec))
    }
}

/// A field relocation's value on one side.
struct FieldVal {
    val: u64,
    /// Memory access size for loads / stores (0: not adjustable, e.g. a bitfield).
    sz: u64,
    type_id: u32,
    validate: bool,
}

/// libbpf's `bpf_core_calc_field_relo` for a matched spec.
fn calc_field(k: u32, btf: &Btf, spec: &Spec) -> Result<FieldVal, String> {
    let acc = spec.acc.last().ok_or("empty access")?;
    let elem_size = |id: u32| -> Result<(u64, u32), String> {
        let (mut eid, mut t) = resolved(btf, id)?;
        for _ in 0..=btf.types().len() {
            let BtfType::Array { elem, .. } = t else {
                return Ok((size(btf, eid)?, eid));
            };
            (eid, t) = resolved(btf, *elem)?;
        }
        Err("array of itself".into())
    };
    if acc.name.is_none() {
        return match k {
            kind::FIELD_BYTE_OFFSET => {
                let (sz, _) = elem_size(acc.type_id)?;
                Ok(FieldVal {
                    val: spec.bit_offset / 8,
                    sz,
                    type_id: acc.type_id,
                    validate: true,
                })
            }
            kind::FIELD_BYTE_SIZE => Ok(FieldVal {
                val: size(btf, acc.type_id)?,
                sz: 0,
                type_id: 0,
                validate: true,
            }),
            _ => Err(format!(
                "{} cannot be applied to an array element",
                kind_name(k)
            )),
        };
    }
    let t = btf.get(acc.type_id).map_err(e2s)?;
    let m = members(t)
        .get(acc.idx as usize)
        .ok_or("accessor outside its struct")?;
    let (ftid, mt) = resolved(btf, m.type_id)?;
    let bit_off = spec.bit_offset;
    let mut bit_sz = u64::from(m.bitfield_size);
    let bitfield = bit_sz > 0;
    let (byte_off, byte_sz);
    if bitfield {
        let mut sz = size(btf, ftid)?;
        if sz == 0 {
            return Err("bitfield of a zero-sized type".into());
        }
        let mut off = bit_off / 8 / sz * sz;
        while bit_off + bit_sz - off * 8 > sz * 8 {
            if sz >= 8 {
                return Err("the bitfield cannot be read with one 64-bit load".into());
            }
            sz *= 2;
            off = bit_off / 8 / sz * sz;
        }
        (byte_off, byte_sz) = (off, sz);
    } else {
        byte_sz = size(btf, ftid)?;
        byte_off = bit_off / 8;
        bit_sz = byte_sz.checked_mul(8).ok_or("size overflows")?;
    }
    let mut v = FieldVal {
        val: 0,
        sz: 0,
        type_id: 0,
        validate: !bitfield,
    };
    match k {
        kind::FIELD_BYTE_OFFSET => {
            v.val = byte_off;
            if !bitfield {
                (v.sz, _) = elem_size(ftid)?;
                v.type_id = ftid;
            }
        }
        kind::FIELD_BYTE_SIZE => v.val = byte_sz,
        kind::FIELD_SIGNED => {
            v.val = u64::from(match mt {
                BtfType::Enum { signed, .. } | BtfType::Enum64 { signed, .. } => *signed,
                BtfType::Int { encoding, .. } => encoding & 1 != 0,
                _ => false,
            });
            v.validate = true;
        }
        kind::FIELD_LSHIFT_U64 => {
            v.val = 64u64.wrapping_sub(bit_off + bit_sz - byte_off * 8);
        }
        kind::FIELD_RSHIFT_U64 => {
            v.val = 64u64.wrapping_sub(bit_sz);
            v.validate = true;
        }
        _ => return Err(format!("{} is not a field relocation", kind_name(k))),
    }
    Ok(v)
}

/// The decision for one relocation.
#[derive(Debug, Default, PartialEq, Eq)]
struct Res {
    orig: u64,
    new: u64,
    validate: bool,
    orig_sz: u64,
    new_sz: u64,
    fail_memsz: bool,
}

fn calc_type(k: u32, btf: &Btf, spec: &Spec) -> Result<u64, String> {
    Ok(match k {
        kind::TYPE_ID_TARGET | kind::TYPE_ID_LOCAL => u64::from(spec.root),
        kind::TYPE_EXISTS | kind::TYPE_MATCHES => 1,
        kind::TYPE_SIZE => size(btf, spec.root)?,
        _ => return Err(format!("{} is not a type relocation", kind_name(k))),
    })
}

fn enum_value(btf: &Btf, spec: &Spec) -> Result<u64, String> {
    let a = &spec.acc[0];
    let t = btf.get(a.type_id).map_err(e2s)?;
    enumerators(t)
        .get(a.idx as usize)
        .map(|(_, v)| *v)
        .ok_or_else(|| "enumerator out of range".to_string())
}

/// libbpf's `bpf_core_calc_relo`: `Ok(None)` is a poisoned instruction.
fn calc_relo(
    k: u32,
    lb: &Btf,
    local: &Spec,
    tb: &Btf,
    targ: Option<&Spec>,
) -> Result<Option<Res>, String> {
    let mut r = Res {
        validate: true,
        ..Res::default()
    };
    if field_based(k) {
        if k == kind::FIELD_EXISTS {
            r.orig = 1;
            r.new = u64::from(targ.is_some());
            return Ok(Some(r));
        }
        let o = calc_field(k, lb, local)?;
        let Some(targ) = targ else { return Ok(None) };
        let n = calc_field(k, tb, targ)?;
        (r.orig, r.validate, r.orig_sz) = (o.val, o.validate, o.sz);
        (r.new, r.new_sz) = (n.val, n.sz);
        if r.orig_sz != r.new_sz {
            let ot = lb.get(o.type_id).map_err(e2s)?;
            let nt = tb.get(n.type_id).map_err(e2s)?;
            let unsigned_int =
                |t: &BtfType| matches!(t, BtfType::Int { encoding, .. } if encoding & 1 == 0);
            let ok = matches!((ot, nt), (BtfType::Ptr { .. }, BtfType::Ptr { .. }))
                || (unsigned_int(ot) && unsigned_int(nt));
            r.fail_memsz = !ok;
        }
    } else if type_based(k) {
        r.orig = calc_type(k, lb, local)?;
        r.validate = k != kind::TYPE_ID_TARGET;
        r.new = targ.map_or(Ok(0), |t| calc_type(k, tb, t))?;
    } else {
        r.orig = if k == kind::ENUMVAL_EXISTS {
            1
        } else {
            enum_value(lb, local)?
        };
        r.new = match (k, targ) {
            (kind::ENUMVAL_EXISTS, t) => u64::from(t.is_some()),
            (_, Some(t)) => enum_value(tb, t)?,
            (_, None) => return Ok(None),
        };
    }
    Ok(Some(r))
}

/// The helper id libbpf calls in place of an instruction whose relocation cannot be
/// satisfied (`0xbad2310`, "bad relo"): no helper has it, so the kernel's verifier refuses
/// the program if the call is reachable. packjit does the same (the runtime's `poison`
/// module); a host cannot register this id.
pub const POISON_HELPER: u32 = 0xbad_2310;

/// What a relocation did to its instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Patched.
    Patched {
        /// The value the local BTF gives.
        local: u64,
        /// The value patched in.
        target: u64,
    },
    /// Nothing in the target satisfies it: the instruction is now `call POISON_HELPER`
    /// (both slots of an `lddw`), and this says which access and why.
    Poisoned(String),
}

/// Overwrites the instruction at the start of `insns` with `call POISON_HELPER` (both
/// slots of an `lddw`, so no half instruction is left for a decoder to trip on).
fn poison(insns: &mut [u8]) {
    let slots = if insns[0] == OP_LDDW && insns.len() >= 16 {
        2
    } else {
        1
    };
    let mut call = [0u8; 8];
    call[0] = 0x85;
    call[4..].copy_from_slice(&POISON_HELPER.to_le_bytes());
    for s in insns[..8 * slots].chunks_exact_mut(8) {
        s.copy_from_slice(&call);
    }
}

/// Resolves relocation `r` (with its access string) and patches the instruction at the start
/// of `insns` (which runs to the end of its function, for an `lddw`'s second slot).
/// An unsatisfiable relocation poisons the instruction ([`Applied::Poisoned`]); `Err` is
/// malformed input. Messages are prefixed by the caller with the section and instruction.
pub fn apply(
    local: &Btf,
    target: Option<&Btf>,
    r: &CoreRelo,
    insns: &mut [u8],
) -> Result<Applied, String> {
    let access = local
        .str_at(r.access_str_off, "field `access_str_off`")
        .map_err(e2s)?;
    let kname = kind_name(r.kind);
    let local_spec = parse_spec(local, r, &access)
        .map_err(|e| format!("CO-RE relocation kind {kname} on type [{}]: {e}", r.type_id))?;
    let what = describe_spec(local, r.kind, &local_spec);
    let ctx =
        |e: String| format!("CO-RE relocation kind {kname} for `{what}` (access {access}): {e}");
    let res = resolve(local, target, r.kind, &local_spec).map_err(|e| ctx(e.clone()))?;
    let res = match res {
        Ok(res) => res,
        Err(why) => {
            if insns.len() < 8 {
                return Err(ctx("the instruction is outside its function".into()));
            }
            poison(insns);
            return Ok(Applied::Poisoned(ctx(format!(
                "cannot be satisfied: {why}"
            ))));
        }
    };
    patch(insns, &res).map_err(ctx)?;
    Ok(Applied::Patched {
        local: res.orig,
        target: res.new,
    })
}

/// The candidates and the decision: `Ok(Err(why))` when the relocation cannot be satisfied.
fn resolve(
    local: &Btf,
    target: Option<&Btf>,
    k: u32,
    local_spec: &Spec,
) -> Result<Result<Res, String>, String> {
    let mut rs = Resolver {
        local,
        target,
        fuel: FUEL,
    };
    if k == kind::TYPE_ID_LOCAL {
        let id = u64::from(local_spec.root);
        return Ok(Ok(Res {
            orig: id,
            new: id,
            validate: false,
            ..Res::default()
        }));
    }
    let lt = local.get(local_spec.root).map_err(e2s)?;
    // Without a target the local type is its own only candidate.
    let (tb, cands): (&Btf, Vec<u32>) = match rs.target {
        None => (local, vec![local_spec.root]),
        Some(tb) => {
            if lt.name().is_empty() {
                return Err(format!(
                    "the local type {} is anonymous: CO-RE matches types by name",
                    describe(lt)
                ));
            }
            let ess = essential_name(lt.name());
            let c = tb
                .types()
                .iter()
                .enumerate()
                .filter(|(_, t)| {
                    kind_compat(t, lt) && !t.name().is_empty() && essential_name(t.name()) == ess
                })
                .map(|(i, _)| i as u32)
                .collect();
            (tb, c)
        }
    };
    let mut chosen: Option<(Res, u64)> = None;
    let mut why = None;
    for &c in &cands {
        let spec = match rs.spec_match(k, local_spec, tb, c)? {
            Match::Yes(s) => s,
            Match::No(w) => {
                why.get_or_insert(w);
                continue;
            }
        };
        let Some(res) = calc_relo(k, local, local_spec, tb, Some(&spec))? else {
            // A matched spec always computes (only a missing one poisons).
            return Err("internal: matched candidate without a value".into());
        };
        match &chosen {
            None => chosen = Some((res, spec.bit_offset)),
            Some((prev, bo)) => {
                if *bo != spec.bit_offset {
                    return Err(format!(
                        "field offset ambiguity between target candidates: bit {bo} != {}",
                        spec.bit_offset
                    ));
                }
                if prev.new != res.new {
                    return Err(format!(
                        "ambiguous between target candidates: {} != {}",
                        prev.new, res.new
                    ));
                }
            }
        }
    }
    if let Some((res, _)) = chosen {
        return Ok(Ok(res));
    }
    match calc_relo(k, local, local_spec, tb, None)? {
        Some(res) => Ok(Ok(res)),
        None => Ok(Err(why.unwrap_or_else(|| {
            format!("no {} in the target BTF", describe(lt))
        }))),
    }
}

const BPF_LD: u8 = 0x00;
const BPF_LDX: u8 = 0x01;
const BPF_ST: u8 = 0x02;
const BPF_STX: u8 = 0x03;
const BPF_ALU: u8 = 0x04;
const BPF_ALU64: u8 = 0x07;
const OP_LDDW: u8 = 0x18;

/// libbpf's `bpf_core_patch_insn` (a poisoned instruction never reaches here).
fn patch(insns: &mut [u8], res: &Res) -> Result<(), String> {
    let insn = insns
        .get(..8)
        .ok_or("the instruction is outside its function")?;
    let code = insn[0];
    let imm = i32::from_le_bytes(insn[4..8].try_into().unwrap());
    let off = i16::from_le_bytes(insn[2..4].try_into().unwrap());
    let unexpected = |what: &str, got: i64| {
        format!(
            "instruction {code:#04x} holds {what} {got}, but the local BTF gives {}",
            res.orig
        )
    };
    match code & 7 {
        BPF_ALU | BPF_ALU64 => {
            if code & 0x08 != 0 {
                return Err(format!(
                    "instruction {code:#04x} has a register operand, not an immediate"
                ));
            }
            if res.validate && i64::from(imm) as u64 != res.orig {
                return Err(unexpected("immediate", i64::from(imm)));
            }
            let fits = res.new <= u64::from(u32::MAX) || i32::try_from(res.new as i64).is_ok();
            if !fits {
                return Err(format!(
                    "value {:#x} does not fit the 32-bit immediate of instruction {code:#04x}",
                    res.new
                ));
            }
            insns[4..8].copy_from_slice(&(res.new as u32).to_le_bytes());
        }
        BPF_LDX | BPF_ST | BPF_STX => {
            if res.validate && i64::from(off) as u64 != res.orig {
                return Err(unexpected("offset", i64::from(off)));
            }
            if res.new > i16::MAX as u64 {
                return Err(format!(
                    "offset {} does not fit the 16-bit offset of instruction {code:#04x}",
                    res.new
                ));
            }
            if res.fail_memsz {
                return Err(format!(
                    "the field is {} bytes in the target, {} locally, and not an unsigned integer or pointer: the access size cannot be adjusted",
                    res.new_sz, res.orig_sz
                ));
            }
            insns[2..4].copy_from_slice(&(res.new as i16).to_le_bytes());
            if res.new_sz != res.orig_sz {
                let bytes = [4u64, 2, 1, 8][usize::from((code >> 3) & 3)];
                if bytes != res.orig_sz {
                    return Err(format!(
                        "instruction {code:#04x} accesses {bytes} bytes, the local field is {}",
                        res.orig_sz
                    ));
                }
                let size = match res.new_sz {
                    4 => 0x00,
                    2 => 0x08,
                    1 => 0x10,
                    8 => 0x18,
                    n => {
                        return Err(format!(
                            "the target field is {n} bytes: no load or store of that size"
                        ))
                    }
                };
                insns[0] = (code & !0x18) | size;
            }
        }
        BPF_LD => {
            let ok = code == OP_LDDW
                && insns[1] >> 4 == 0
                && off == 0
                && insns.get(8..16).is_some_and(|n| n[..4] == [0, 0, 0, 0]);
            if !ok {
                return Err(format!(
                    "instruction {code:#04x} is not a plain lddw (64-bit immediate)"
                ));
            }
            let hi = u32::from_le_bytes(insns[12..16].try_into().unwrap());
            let cur = u64::from(imm as u32) | (u64::from(hi) << 32);
            if res.validate && cur != res.orig {
                return Err(unexpected("immediate", cur as i64));
            }
            insns[4..8].copy_from_slice(&(res.new as u32).to_le_bytes());
            insns[12..16].copy_from_slice(&((res.new >> 32) as u32).to_le_bytes());
        }
        _ => {
            return Err(format!(
                "instruction {code:#04x} is not an ALU immediate, load, store or lddw"
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavours_are_ignored_in_names() {
        assert_eq!(essential_name("task___v2"), "task");
        assert_eq!(essential_name("task___v2___x"), "task___v2");
        assert_eq!(essential_name("task"), "task");
        assert_eq!(essential_name("a____b"), "a____b");
        assert_eq!(essential_name("___x"), "___x");
        assert_eq!(essential_name(""), "");
    }

    #[test]
    fn btf_ext_headers_and_records_are_checked() {
        let mut v = vec![0x9f, 0xeb, 1, 0];
        v.extend_from_slice(&32u32.to_le_bytes());
        for w in [0u32, 0, 0, 0, 0, 4 + 8 + 16] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(&16u32.to_le_bytes());
        for w in [5u32, 1, 8, 2, 7, 0] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        let s = parse_btf_ext(&v).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].name_off, 5);
        assert_eq!(
            s[0].relos[0],
            CoreRelo {
                index: 0,
                insn_off: 8,
                type_id: 2,
                access_str_off: 7,
                kind: 0
            }
        );
        // Truncated records.
        let e = parse_btf_ext(&v[..v.len() - 4]).unwrap_err();
        assert!(e.contains("core_relo_off"), "{e}");
        let mut t = v.clone();
        t[28..32].copy_from_slice(&(4u32 + 8 + 12).to_le_bytes());
        let e = parse_btf_ext(&t[..t.len() - 4]).unwrap_err();
        assert!(e.contains("info #0") && e.contains("`num_info`"), "{e}");
        let mut t = v.clone();
        t[32..36].copy_from_slice(&15u32.to_le_bytes());
        assert!(parse_btf_ext(&t).unwrap_err().contains("`rec_size`"));
        assert!(parse_btf_ext(&v[..6]).unwrap_err().contains("truncated"));
        let r = CoreRelo {
            kind: 13,
            ..s[0].relos[0]
        };
        assert_eq!(check_record(&r).unwrap_err().0, "kind");
        // Arbitrary bytes never panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20000 {
            let mut m = v.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize) % m.len();
                m[at] = (x >> 40) as u8;
            }
            let _ = parse_btf_ext(&m);
        }
    }
}
