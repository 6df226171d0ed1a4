//! A small reader for BTF, the BPF Type Format clang emits in `.BTF` (`clang -g -target bpf`).
//!
//! Only what the ELF loader needs: the type table (every kind up to `ENUM64`), names,
//! [`Btf::resolve`] through typedefs and modifiers, [`Btf::size_of`], struct members with
//! their bit offsets, `DATASEC` / `VAR` (libbpf's BTF-defined maps in `.maps`), and strings by
//! offset ([`Btf::str_at`]: `.BTF.ext`'s section names and CO-RE access strings). We read
//! BTF ourselves rather than depend on aya-obj: that crate brings a large dependency tree and
//! its own object model, and we need a few hundred lines of it.
//!
//! Every malformed input (truncated, bad magic, a type id out of range, a loop in a typedef
//! chain, a name outside the string section) is an [`Error`] naming the section, the type id
//! and the field; nothing here panics or allocates more than the input's size.

use crate::{Error, ErrorKind};

/// `btf_header.magic`.
pub const BTF_MAGIC: u16 = 0xeb9f;

/// `BTF_KIND_*`.
pub mod kind {
    /// `int`, `char`, `_Bool`, ...
    pub const INT: u32 = 1;
    /// Pointer.
    pub const PTR: u32 = 2;
    /// Array.
    pub const ARRAY: u32 = 3;
    /// Struct.
    pub const STRUCT: u32 = 4;
    /// Union.
    pub const UNION: u32 = 5;
    /// 32-bit enum.
    pub const ENUM: u32 = 6;
    /// Forward declaration.
    pub const FWD: u32 = 7;
    /// Typedef.
    pub const TYPEDEF: u32 = 8;
    /// `volatile`.
    pub const VOLATILE: u32 = 9;
    /// `const`.
    pub const CONST: u32 = 10;
    /// `restrict`.
    pub const RESTRICT: u32 = 11;
    /// Function (name + prototype).
    pub const FUNC: u32 = 12;
    /// Function prototype.
    pub const FUNC_PROTO: u32 = 13;
    /// Variable.
    pub const VAR: u32 = 14;
    /// Data section (its variables).
    pub const DATASEC: u32 = 15;
    /// Floating point.
    pub const FLOAT: u32 = 16;
    /// `__attribute__((btf_decl_tag))`.
    pub const DECL_TAG: u32 = 17;
    /// `__attribute__((btf_type_tag))`.
    pub const TYPE_TAG: u32 = 18;
    /// 64-bit enum.
    pub const ENUM64: u32 = 19;
}

/// A struct or union member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BtfMember {
    /// Member name (empty for anonymous members).
    pub name: String,
    /// Its type.
    pub type_id: u32,
    /// Offset from the start of the struct, in bits.
    pub bit_offset: u32,
    /// Bitfield width in bits (0: not a bitfield).
    pub bitfield_size: u32,
}

/// A `DATASEC` entry: a `VAR` (or `FUNC`) at `offset` in the section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BtfVarSecinfo {
    /// The `VAR` type.
    pub type_id: u32,
    /// Offset in the section (clang leaves 0 in objects and relocates it; use the symbol).
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

/// A function prototype parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BtfParam {
    /// Name (may be empty).
    pub name: String,
    /// Type (0 with an empty name: varargs).
    pub type_id: u32,
}

/// One BTF type. Ids are indices into [`Btf::types`]; id 0 is `void`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BtfType {
    /// Type id 0.
    Void,
    /// Integer.
    Int {
        /// Name.
        name: String,
        /// Size in bytes.
        size: u32,
        /// `BTF_INT_SIGNED` / `CHAR` / `BOOL`.
        encoding: u32,
        /// Bit offset of the value.
        offset: u32,
        /// Bits used.
        bits: u32,
    },
    /// Pointer to `type_id`.
    Ptr {
        /// Pointee.
        type_id: u32,
    },
    /// Array.
    Array {
        /// Element type.
        elem: u32,
        /// Index type.
        index: u32,
        /// Number of elements.
        nelems: u32,
    },
    /// Struct.
    Struct {
        /// Name (empty: anonymous).
        name: String,
        /// Size in bytes.
        size: u32,
        /// Members.
        members: Vec<BtfMember>,
    },
    /// Union.
    Union {
        /// Name (empty: anonymous).
        name: String,
        /// Size in bytes.
        size: u32,
        /// Members.
        members: Vec<BtfMember>,
    },
    /// Enum (32-bit values).
    Enum {
        /// Name.
        name: String,
        /// Size in bytes.
        size: u32,
        /// `(name, value)` (sign-extended when `signed`).
        values: Vec<(String, i64)>,
        /// `kind_flag`: the values are signed.
        signed: bool,
    },
    /// Forward declaration.
    Fwd {
        /// Name.
        name: String,
        /// Of a union (else of a struct).
        union: bool,
    },
    /// Typedef.
    Typedef {
        /// Name.
        name: String,
        /// Aliased type.
        type_id: u32,
    },
    /// `volatile`.
    Volatile {
        /// Qualified type.
        type_id: u32,
    },
    /// `const`.
    Const {
        /// Qualified type.
        type_id: u32,
    },
    /// `restrict`.
    Restrict {
        /// Qualified type.
        type_id: u32,
    },
    /// Function.
    Func {
        /// Name.
        name: String,
        /// Its `FUNC_PROTO`.
        type_id: u32,
        /// Linkage (static, global, extern).
        linkage: u32,
    },
    /// Function prototype.
    FuncProto {
        /// Return type.
        ret: u32,
        /// Parameters.
        params: Vec<BtfParam>,
    },
    /// Variable.
    Var {
        /// Name.
        name: String,
        /// Its type.
        type_id: u32,
        /// Linkage.
        linkage: u32,
    },
    /// Data section.
    Datasec {
        /// Section name.
        name: String,
        /// Size (0 in objects).
        size: u32,
        /// Its variables.
        vars: Vec<BtfVarSecinfo>,
    },
    /// Floating point.
    Float {
        /// Name.
        name: String,
        /// Size in bytes.
        size: u32,
    },
    /// Declaration tag.
    DeclTag {
        /// Tag.
        name: String,
        /// Tagged type.
        type_id: u32,
        /// Member / parameter index, -1 for the type itself.
        component_idx: i32,
    },
    /// Type tag.
    TypeTag {
        /// Tag.
        name: String,
        /// Tagged type.
        type_id: u32,
    },
    /// Enum with 64-bit values.
    Enum64 {
        /// Name.
        name: String,
        /// Size in bytes.
        size: u32,
        /// `(name, value)` (the bits; signedness is the type's).
        values: Vec<(String, u64)>,
        /// `kind_flag`: the values are signed.
        signed: bool,
    },
}

impl BtfType {
    /// Name of the kind, for messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            BtfType::Void => "void",
            BtfType::Int { .. } => "INT",
            BtfType::Ptr { .. } => "PTR",
            BtfType::Array { .. } => "ARRAY",
            BtfType::Struct { .. } => "STRUCT",
            BtfType::Union { .. } => "UNION",
            BtfType::Enum { .. } => "ENUM",
            BtfType::Fwd { .. } => "FWD",
            BtfType::Typedef { .. } => "TYPEDEF",
            BtfType::Volatile { .. } => "VOLATILE",
            BtfType::Const { .. } => "CONST",
            BtfType::Restrict { .. } => "RESTRICT",
            BtfType::Func { .. } => "FUNC",
            BtfType::FuncProto { .. } => "FUNC_PROTO",
            BtfType::Var { .. } => "VAR",
            BtfType::Datasec { .. } => "DATASEC",
            BtfType::Float { .. } => "FLOAT",
            BtfType::DeclTag { .. } => "DECL_TAG",
            BtfType::TypeTag { .. } => "TYPE_TAG",
            BtfType::Enum64 { .. } => "ENUM64",
        }
    }

    /// The type's name (empty for kinds without one).
    pub fn name(&self) -> &str {
        match self {
            BtfType::Int { name, .. }
            | BtfType::Struct { name, .. }
            | BtfType::Union { name, .. }
            | BtfType::Enum { name, .. }
            | BtfType::Fwd { name, .. }
            | BtfType::Typedef { name, .. }
            | BtfType::Func { name, .. }
            | BtfType::Var { name, .. }
            | BtfType::Datasec { name, .. }
            | BtfType::Float { name, .. }
            | BtfType::DeclTag { name, .. }
            | BtfType::TypeTag { name, .. }
            | BtfType::Enum64 { name, .. } => name,
            _ => "",
        }
    }

    /// Every type id this type refers to, with the field holding it.
    fn refs(&self) -> Vec<(&'static str, u32)> {
        match self {
            BtfType::Ptr { type_id }
            | BtfType::Typedef { type_id, .. }
            | BtfType::Volatile { type_id }
            | BtfType::Const { type_id }
            | BtfType::Restrict { type_id }
            | BtfType::Func { type_id, .. }
            | BtfType::Var { type_id, .. }
            | BtfType::DeclTag { type_id, .. }
            | BtfType::TypeTag { type_id, .. } => vec![("type", *type_id)],
            BtfType::Array { elem, index, .. } => vec![("type", *elem), ("index_type", *index)],
            BtfType::Struct { members, .. } | BtfType::Union { members, .. } => members
                .iter()
                .map(|m| ("members.type", m.type_id))
                .collect(),
            BtfType::FuncProto { ret, params } => std::iter::once(("type", *ret))
                .chain(params.iter().map(|p| ("params.type", p.type_id)))
                .collect(),
            BtfType::Datasec { vars, .. } => {
                vars.iter().map(|v| ("vars.type", v.type_id)).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// A parsed `.BTF` section.
#[derive(Clone, Debug)]
pub struct Btf {
    section: String,
    types: Vec<BtfType>,
    // The string section, for names other types refer to by offset (`.BTF.ext`'s section
    // names and CO-RE access strings).
    strings: Vec<u8>,
}

fn err(section: &str, msg: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!("BTF section `{section}`: {msg}"),
    )
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> Option<u32> {
        let v = self.b.get(self.pos..self.pos.checked_add(4)?)?;
        self.pos += 4;
        Some(u32::from_le_bytes(v.try_into().ok()?))
    }
}

impl Btf {
    /// Parses the contents of a `.BTF` section; `section` names it in errors.
    pub fn parse(data: &[u8], section: &str) -> Result<Btf, Error> {
        let hdr = |i: usize| -> Result<u32, Error> {
            data.get(i..i + 4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                .ok_or_else(|| {
                    err(
                        section,
                        format!("truncated header ({} bytes, at least 24)", data.len()),
                    )
                })
        };
        if data.len() < 2 {
            return Err(err(
                section,
                format!("truncated header ({} bytes)", data.len()),
            ));
        }
        let magic = u16::from_le_bytes([data[0], data[1]]);
        if magic == BTF_MAGIC.swap_bytes() {
            return Err(err(section, "big-endian BTF is not supported"));
        }
        if magic != BTF_MAGIC {
            return Err(err(
                section,
                format!("bad magic {magic:#06x} (expected {BTF_MAGIC:#06x})"),
            ));
        }
        let version = *data.get(2).unwrap_or(&0);
        if version != 1 {
            return Err(err(section, format!("version {version}, expected 1")));
        }
        let hdr_len = hdr(4)? as usize;
        let (type_off, type_len, str_off, str_len) = (hdr(8)?, hdr(12)?, hdr(16)?, hdr(20)?);
        if hdr_len < 24 || hdr_len > data.len() {
            return Err(err(
                section,
                format!(
                    "header length {hdr_len} (at least 24, at most the section's {})",
                    data.len()
                ),
            ));
        }
        let body = &data[hdr_len..];
        let part = |what: &str, off: u32, len: u32| -> Result<&[u8], Error> {
            let (o, l) = (off as usize, len as usize);
            o.checked_add(l)
                .and_then(|e| body.get(o..e))
                .ok_or_else(|| {
                    err(
                        section,
                        format!(
                            "header field `{what}_off`/`{what}_len` = {off:#x}/{len:#x} is outside the section ({} bytes after the header)",
                            body.len()
                        ),
                    )
                })
        };
        let types = part("type", type_off, type_len)?;
        let strings = part("str", str_off, str_len)?;
        if strings.first().is_some_and(|&c| c != 0) {
            return Err(err(
                section,
                "string section does not start with an empty string",
            ));
        }
        let name = |id: usize, field: &str, off: u32| -> Result<String, Error> {
            if off == 0 {
                return Ok(String::new());
            }
            let s = strings.get(off as usize..).ok_or_else(|| {
                err(
                    section,
                    format!(
                        "type [{id}] field `{field}`: string offset {off:#x} outside the string section ({} bytes)",
                        strings.len()
                    ),
                )
            })?;
            let end = s.iter().position(|&c| c == 0).ok_or_else(|| {
                err(
                    section,
                    format!("type [{id}] field `{field}`: string at {off:#x} is not terminated"),
                )
            })?;
            Ok(String::from_utf8_lossy(&s[..end]).into_owned())
        };
        let mut out = vec![BtfType::Void];
        let mut r = Reader { b: types, pos: 0 };
        while r.pos < types.len() {
            let id = out.len();
            let trunc = |field: &str| {
                err(
                    section,
                    format!("type [{id}] field `{field}`: truncated (type section ends)"),
                )
            };
            let name_off = r.u32().ok_or_else(|| trunc("name_off"))?;
            let info = r.u32().ok_or_else(|| trunc("info"))?;
            let size_or_type = r.u32().ok_or_else(|| trunc("size/type"))?;
            let vlen = info & 0xffff;
            let k = (info >> 24) & 0x1f;
            let kflag = info >> 31 != 0;
            let nm = || name(id, "name_off", name_off);
            let t = match k {
                kind::INT => {
                    let v = r.u32().ok_or_else(|| trunc("int encoding"))?;
                    BtfType::Int {
                        name: nm()?,
                        size: size_or_type,
                        encoding: (v >> 24) & 0xf,
                        offset: (v >> 16) & 0xff,
                        bits: v & 0xff,
                    }
                }
                kind::PTR => BtfType::Ptr {
                    type_id: size_or_type,
                },
                kind::ARRAY => {
                    let elem = r.u32().ok_or_else(|| trunc("array.type"))?;
                    let index = r.u32().ok_or_else(|| trunc("array.index_type"))?;
                    let nelems = r.u32().ok_or_else(|| trunc("array.nelems"))?;
                    BtfType::Array {
                        elem,
                        index,
                        nelems,
                    }
                }
                kind::STRUCT | kind::UNION => {
                    let mut members = Vec::new();
                    for _ in 0..vlen {
                        let n = r.u32().ok_or_else(|| trunc("members.name_off"))?;
                        let ty = r.u32().ok_or_else(|| trunc("members.type"))?;
                        let off = r.u32().ok_or_else(|| trunc("members.offset"))?;
                        let (bit_offset, bitfield_size) = if kflag {
                            (off & 0xff_ffff, off >> 24)
                        } else {
                            (off, 0)
                        };
                        members.push(BtfMember {
                            name: name(id, "members.name_off", n)?,
                            type_id: ty,
                            bit_offset,
                            bitfield_size,
                        });
                    }
                    if k == kind::STRUCT {
                        BtfType::Struct {
                            name: nm()?,
                            size: size_or_type,
                            members,
                        }
                    } else {
                        BtfType::Union {
                            name: nm()?,
                            size: size_or_type,
                            members,
                        }
                    }
                }
                kind::ENUM => {
                    let mut values = Vec::new();
                    for _ in 0..vlen {
                        let n = r.u32().ok_or_else(|| trunc("enum.name_off"))?;
                        let v = r.u32().ok_or_else(|| trunc("enum.val"))?;
                        let v = if kflag {
                            i64::from(v as i32)
                        } else {
                            i64::from(v)
                        };
                        values.push((name(id, "enum.name_off", n)?, v));
                    }
                    BtfType::Enum {
                        name: nm()?,
                        size: size_or_type,
                        values,
                        signed: kflag,
                    }
                }
                kind::FWD => BtfType::Fwd {
                    name: nm()?,
                    union: kflag,
                },
                kind::TYPEDEF => BtfType::Typedef {
                    name: nm()?,
                    type_id: size_or_type,
                },
                kind::VOLATILE => BtfType::Volatile {
                    type_id: size_or_type,
                },
                kind::CONST => BtfType::Const {
                    type_id: size_or_type,
                },
                kind::RESTRICT => BtfType::Restrict {
                    type_id: size_or_type,
                },
                kind::FUNC => BtfType::Func {
                    name: nm()?,
                    type_id: size_or_type,
                    linkage: vlen,
                },
                kind::FUNC_PROTO => {
                    let mut params = Vec::new();
                    for _ in 0..vlen {
                        let n = r.u32().ok_or_else(|| trunc("params.name_off"))?;
                        let ty = r.u32().ok_or_else(|| trunc("params.type"))?;
                        params.push(BtfParam {
                            name: name(id, "params.name_off", n)?,
                            type_id: ty,
                        });
                    }
                    BtfType::FuncProto {
                        ret: size_or_type,
                        params,
                    }
                }
                kind::VAR => {
                    let linkage = r.u32().ok_or_else(|| trunc("var.linkage"))?;
                    BtfType::Var {
                        name: nm()?,
                        type_id: size_or_type,
                        linkage,
                    }
                }
                kind::DATASEC => {
                    let mut vars = Vec::new();
                    for _ in 0..vlen {
                        let ty = r.u32().ok_or_else(|| trunc("vars.type"))?;
                        let offset = r.u32().ok_or_else(|| trunc("vars.offset"))?;
                        let size = r.u32().ok_or_else(|| trunc("vars.size"))?;
                        vars.push(BtfVarSecinfo {
                            type_id: ty,
                            offset,
                            size,
                        });
                    }
                    BtfType::Datasec {
                        name: nm()?,
                        size: size_or_type,
                        vars,
                    }
                }
                kind::FLOAT => BtfType::Float {
                    name: nm()?,
                    size: size_or_type,
                },
                kind::DECL_TAG => {
                    let c = r.u32().ok_or_else(|| trunc("decl_tag.component_idx"))?;
                    BtfType::DeclTag {
                        name: nm()?,
                        type_id: size_or_type,
                        component_idx: c as i32,
                    }
                }
                kind::TYPE_TAG => BtfType::TypeTag {
                    name: nm()?,
                    type_id: size_or_type,
                },
                kind::ENUM64 => {
                    let mut values = Vec::new();
                    for _ in 0..vlen {
                        let n = r.u32().ok_or_else(|| trunc("enum64.name_off"))?;
                        let lo = r.u32().ok_or_else(|| trunc("enum64.val_lo32"))?;
                        let hi = r.u32().ok_or_else(|| trunc("enum64.val_hi32"))?;
                        values.push((
                            name(id, "enum64.name_off", n)?,
                            u64::from(lo) | (u64::from(hi) << 32),
                        ));
                    }
                    BtfType::Enum64 {
                        name: nm()?,
                        size: size_or_type,
                        values,
                        signed: kflag,
                    }
                }
                other => {
                    return Err(err(
                        section,
                        format!("type [{id}] field `info`: unknown kind {other}"),
                    ))
                }
            };
            out.push(t);
        }
        // Every reference in range, so lookups below only fail on loops.
        for (id, t) in out.iter().enumerate() {
            for (field, r) in t.refs() {
                if r as usize >= out.len() {
                    return Err(err(
                        section,
                        format!(
                            "type [{id}] ({}) field `{field}`: type id {r} out of range ({} types)",
                            t.kind_name(),
                            out.len()
                        ),
                    ));
                }
            }
        }
        Ok(Btf {
            section: section.into(),
            types: out,
            strings: strings.to_vec(),
        })
    }

    /// All types, id 0 (`void`) first.
    pub fn types(&self) -> &[BtfType] {
        &self.types
    }

    /// The type with this id.
    pub fn get(&self, id: u32) -> Result<&BtfType, Error> {
        self.types.get(id as usize).ok_or_else(|| {
            err(
                &self.section,
                format!("type id {id} out of range ({} types)", self.types.len()),
            )
        })
    }

    /// The first type named `name` of the given kind (a `BTF_KIND_*`).
    pub fn find(&self, name: &str, kind_name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|t| t.kind_name() == kind_name && t.name() == name)
            .map(|i| i as u32)
    }

    /// Follows typedefs, `const` / `volatile` / `restrict` and type tags to the underlying type
    /// id. A loop is an error naming the type where it was detected.
    pub fn resolve(&self, id: u32) -> Result<u32, Error> {
        let mut cur = id;
        for _ in 0..=self.types.len() {
            match self.get(cur)? {
                BtfType::Typedef { type_id, .. }
                | BtfType::Volatile { type_id }
                | BtfType::Const { type_id }
                | BtfType::Restrict { type_id }
                | BtfType::TypeTag { type_id, .. } => cur = *type_id,
                _ => return Ok(cur),
            }
        }
        Err(err(
            &self.section,
            format!("type [{id}] field `type`: loop in its typedef / modifier chain"),
        ))
    }

    /// Size in bytes of a type (through typedefs, modifiers and arrays). Types without a
    /// size (`void`, functions, forward declarations) are an error naming the type.
    pub fn size_of(&self, id: u32) -> Result<u64, Error> {
        let mut mul: u64 = 1;
        let mut cur = id;
        let overflow = || {
            err(
                &self.section,
                format!("type [{id}] field `size`: size overflows"),
            )
        };
        for _ in 0..=self.types.len() {
            let r = self.resolve(cur)?;
            let t = self.get(r)?;
            let size = match t {
                BtfType::Int { size, .. }
                | BtfType::Struct { size, .. }
                | BtfType::Union { size, .. }
                | BtfType::Enum { size, .. }
                | BtfType::Enum64 { size, .. }
                | BtfType::Datasec { size, .. }
                | BtfType::Float { size, .. } => u64::from(*size),
                BtfType::Ptr { .. } => 8,
                BtfType::Var { type_id, .. } => {
                    cur = *type_id;
                    continue;
                }
                BtfType::Array { elem, nelems, .. } => {
                    mul = mul.checked_mul(u64::from(*nelems)).ok_or_else(overflow)?;
                    cur = *elem;
                    continue;
                }
                other => {
                    return Err(err(
                        &self.section,
                        format!(
                            "type [{r}] ({}{}) field `size`: has no size (asked for type [{id}])",
                            other.kind_name(),
                            if other.name().is_empty() {
                                String::new()
                            } else {
                                format!(" `{}`", other.name())
                            }
                        ),
                    ))
                }
            };
            return size.checked_mul(mul).ok_or_else(overflow);
        }
        Err(err(
            &self.section,
            format!("type [{id}] field `type`: loop in its array / variable chain"),
        ))
    }

    /// The members of a struct or union (after [`Btf::resolve`]).
    pub fn members(&self, id: u32) -> Result<&[BtfMember], Error> {
        let r = self.resolve(id)?;
        match self.get(r)? {
            BtfType::Struct { members, .. } | BtfType::Union { members, .. } => Ok(members),
            other => Err(err(
                &self.section,
                format!(
                    "type [{id}] field `kind`: {} is not a struct or union",
                    other.kind_name()
                ),
            )),
        }
    }

    /// The NUL-terminated string at `off` of the string section (`.BTF.ext` refers to names
    /// and CO-RE access strings this way). Outside the section or unterminated: an error
    /// naming `what` (the referring field).
    pub fn str_at(&self, off: u32, what: &str) -> Result<String, Error> {
        let s = self.strings.get(off as usize..).ok_or_else(|| {
            err(
                &self.section,
                format!(
                    "{what}: string offset {off:#x} outside the string section ({} bytes)",
                    self.strings.len()
                ),
            )
        })?;
        let end = s.iter().position(|&c| c == 0).ok_or_else(|| {
            err(
                &self.section,
                format!("{what}: string at {off:#x} is not terminated"),
            )
        })?;
        Ok(String::from_utf8_lossy(&s[..end]).into_owned())
    }

    /// The section name this was parsed from, for messages.
    pub fn section(&self) -> &str {
        &self.section
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob from raw type words and a string table.
    fn blob(types: &[u32], strings: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        v.push(1);
        v.push(0);
        let tl = (types.len() * 4) as u32;
        for w in [24u32, 0, tl, tl, strings.len() as u32] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        for w in types {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(strings);
        v
    }

    const STR: &[u8] = b"\0int\0s\0a\0b\0t\0";

    fn info(kind: u32, vlen: u32) -> u32 {
        (kind << 24) | vlen
    }

    #[test]
    fn parses_ints_structs_typedefs_arrays() {
        let b = blob(
            &[
                // [1] int, 4 bytes, signed, 32 bits
                1,
                info(kind::INT, 0),
                4,
                (1 << 24) | 32,
                // [2] struct s { int a; int b[3] } (16 bytes)
                5,
                info(kind::STRUCT, 2),
                16,
                7,
                1,
                0,
                9,
                3,
                32,
                // [3] array int[3]
                0,
                info(kind::ARRAY, 0),
                0,
                1,
                1,
                3,
                // [4] typedef t = const s
                11,
                info(kind::TYPEDEF, 0),
                5,
                // [5] const s
                0,
                info(kind::CONST, 0),
                2,
                // [6] ptr to t
                0,
                info(kind::PTR, 0),
                4,
            ],
            STR,
        );
        let btf = Btf::parse(&b, ".BTF").unwrap();
        assert_eq!(btf.resolve(4).unwrap(), 2);
        assert_eq!(btf.size_of(4).unwrap(), 16);
        assert_eq!(btf.size_of(3).unwrap(), 12);
        assert_eq!(btf.size_of(6).unwrap(), 8);
        let m = btf.members(4).unwrap();
        assert_eq!(m[1].name, "b");
        assert_eq!(m[1].bit_offset, 32);
        assert!(btf.size_of(0).is_err());
    }

    #[test]
    fn malformed_inputs_are_named_errors() {
        let e = Btf::parse(&[0x9f], ".BTF").unwrap_err();
        assert!(e.message.contains("truncated"), "{e}");
        let e = Btf::parse(&[0, 0, 1, 0], ".BTF").unwrap_err();
        assert!(e.message.contains("bad magic"), "{e}");
        // Out-of-range pointee.
        let e = Btf::parse(&blob(&[0, info(kind::PTR, 0), 9], STR), ".BTF").unwrap_err();
        assert!(
            e.message.contains("type [1]")
                && e.message.contains("`type`")
                && e.message.contains("out of range"),
            "{e}"
        );
        // Typedef loop: [1] -> [2] -> [1].
        let btf = Btf::parse(
            &blob(
                &[11, info(kind::TYPEDEF, 0), 2, 11, info(kind::TYPEDEF, 0), 1],
                STR,
            ),
            ".BTF",
        )
        .unwrap();
        let e = btf.size_of(1).unwrap_err();
        assert!(
            e.message.contains("loop") && e.message.contains("type [1]"),
            "{e}"
        );
        // Truncated member list.
        let e = Btf::parse(&blob(&[5, info(kind::STRUCT, 2), 8, 7, 0], STR), ".BTF").unwrap_err();
        assert!(
            e.message.contains("type [1]") && e.message.contains("truncated"),
            "{e}"
        );
        // Name outside the strings.
        let e = Btf::parse(&blob(&[99, info(kind::FWD, 0), 0], STR), ".BTF").unwrap_err();
        assert!(e.message.contains("name_off"), "{e}");
        // Array loop: an array of itself.
        let btf = Btf::parse(&blob(&[0, info(kind::ARRAY, 0), 0, 1, 1, 2], STR), ".BTF").unwrap();
        assert!(btf.size_of(1).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut s = 0x1234_5678_9abc_def1u64;
        let base = blob(
            &[
                1,
                info(kind::INT, 0),
                4,
                32,
                5,
                info(kind::STRUCT, 1),
                4,
                7,
                1,
                0,
                0,
                info(kind::PTR, 0),
                2,
            ],
            STR,
        );
        for _ in 0..20000 {
            let mut m = base.clone();
            for _ in 0..3 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let at = (s as usize) % m.len();
                m[at] = (s >> 32) as u8;
            }
            if let Ok(b) = Btf::parse(&m, ".BTF") {
                for id in 0..b.types().len() as u32 + 2 {
                    let _ = b.size_of(id);
                    let _ = b.members(id);
                }
            }
        }
    }
}
