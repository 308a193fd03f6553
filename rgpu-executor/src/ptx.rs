//! A small reader of PTX text: the kernel entries with their parameter
//! layouts, and the module-scope variables with their sizes.
//!
//! The `sim` executor runs on it (it has no driver to ask), and it lets the
//! image checks tell PTX text apart from binaries. It reads declarations only,
//! never instructions: function bodies and initialisers are skipped. Any
//! input, however malformed, gives a result or a [`PtxError`], never a panic.

use rgpu_proto::reply::{FunctionInfo, ParamSlot};
use rgpu_proto::{MAX_KERNEL_PARAMS, MAX_KERNEL_PARAMS_BYTES};
use thiserror::Error;

/// Largest `.align` accepted (PTX alignments are small powers of two).
const MAX_ALIGN: u64 = 1 << 12;
/// Largest module variable accepted; larger ones could not be loaded anyway.
const MAX_VARIABLE_BYTES: u64 = 1 << 40;
/// How much of the text near an error is quoted in the message.
const NEAR_CHARS: usize = 64;

/// Why a text is not PTX this reader understands.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PtxError {
    #[error("not PTX text: no .version directive")]
    NoVersion,
    #[error("unbalanced braces")]
    Unbalanced,
    #[error("malformed {what} near `{near}`")]
    Malformed { what: &'static str, near: String },
    #[error("{what} too large")]
    TooLarge { what: &'static str },
    #[error("symbol {0} declared twice")]
    Duplicate(String),
}

/// One `.entry`: a kernel and its parameter buffer layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxEntry {
    pub name: String,
    pub info: FunctionInfo,
}

/// One module-scope `.global` or `.const` variable with storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxVariable {
    pub name: String,
    pub size: u64,
}

/// What a PTX module declares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PtxModule {
    pub entries: Vec<PtxEntry>,
    pub variables: Vec<PtxVariable>,
}

impl PtxModule {
    pub fn entry(&self, name: &str) -> Option<&PtxEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    pub fn variable(&self, name: &str) -> Option<&PtxVariable> {
        self.variables.iter().find(|v| v.name == name)
    }
}

/// The PTX text of a module image: the bytes before the first NUL, when they
/// are UTF-8 and carry a `.version` directive (binaries never do: an ELF
/// header holds a NUL within its first bytes).
pub fn text(image: &[u8]) -> Option<&str> {
    let end = image.iter().position(|b| *b == 0).unwrap_or(image.len());
    let text = std::str::from_utf8(image.get(..end)?).ok()?;
    text.contains(".version").then_some(text)
}

/// Reads the declarations of a PTX module.
pub fn parse(text: &str) -> Result<PtxModule, PtxError> {
    let tokens = tokenize(text);
    let mut module = PtxModule::default();
    let mut has_version = false;
    // Names seen, so duplicates are found without quadratic scans.
    let mut names = std::collections::HashSet::new();
    let mut pos = 0;
    while pos < tokens.len() {
        let statement = next_statement(&tokens, pos)?;
        let decl = tokens.get(pos..statement.end).unwrap_or_default();
        let initializer = statement
            .initializer
            .and_then(|(start, end)| tokens.get(start..end))
            .map(initializer_items);
        pos = statement.next;
        if decl.first() == Some(&".version") {
            has_version = true;
        }
        if decl.contains(&".entry") {
            let entry = parse_entry(decl)?;
            if !names.insert(entry.name.clone()) {
                return Err(PtxError::Duplicate(entry.name));
            }
            module.entries.push(entry);
        } else if !decl.contains(&".func")
            && !decl.contains(&".extern")
            && (decl.contains(&".global") || decl.contains(&".const"))
        {
            for variable in parse_variables(decl, initializer)? {
                if !names.insert(variable.name.clone()) {
                    return Err(PtxError::Duplicate(variable.name));
                }
                module.variables.push(variable);
            }
        }
        if statement.opens_body {
            pos = skip_body(&tokens, pos)?;
        }
    }
    if !has_version {
        return Err(PtxError::NoVersion);
    }
    Ok(module)
}

/// Directives that take a line of their own and no `;`.
const LINE_DIRECTIVES: [&str; 4] = [".version", ".target", ".address_size", ".file"];

/// Splits PTX into tokens: directives (`.param`), identifiers and numbers,
/// and single punctuation characters. Comments and strings are dropped (a
/// `//` inside a `.file` name is not a comment). A `;` is added after the
/// line of a directive that has none, so every statement ends with one.
fn tokenize(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut line_start = 0;
    let mut close_line = false;
    let mut i = 0;
    while let Some(&c) = bytes.get(i) {
        let next = bytes.get(i + 1).copied();
        if c == b'\n' {
            if close_line {
                tokens.push(";");
                close_line = false;
            }
            line_start = tokens.len();
            i += 1;
        } else if c == b'/' && next == Some(b'/') {
            i = find_from(bytes, i, b"\n").unwrap_or(bytes.len());
        } else if c == b'/' && next == Some(b'*') {
            i = find_from(bytes, i + 2, b"*/").map_or(bytes.len(), |p| p + 2);
        } else if c == b'"' {
            i += 1;
            while let Some(&s) = bytes.get(i) {
                i += if s == b'\\' { 2 } else { 1 };
                if s == b'"' {
                    break;
                }
            }
        } else if is_word(c) || (c == b'.' && next.is_some_and(is_word)) {
            let start = i;
            i += 1;
            while bytes.get(i).copied().is_some_and(is_word) {
                i += 1;
            }
            if let Some(word) = text.get(start..i) {
                close_line |= tokens.len() == line_start && LINE_DIRECTIVES.contains(&word);
                tokens.push(word);
            }
        } else if c.is_ascii_punctuation() {
            tokens.extend(text.get(i..i + 1));
            i += 1;
        } else {
            // Whitespace, and bytes of non-ASCII characters (never part of
            // a declaration PTX allows).
            i += 1;
        }
    }
    if close_line {
        tokens.push(";");
    }
    tokens
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'%')
}

fn find_from(haystack: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// A module-scope statement: its declaration runs from where it starts to
/// `end` (exclusive: the `=`, `;` or `{` after it).
struct Statement {
    end: usize,
    /// Just past the `;` or `{` that closes it.
    next: usize,
    /// The tokens between `=` and `;`, if any.
    initializer: Option<(usize, usize)>,
    /// The statement is a function header followed by a body.
    opens_body: bool,
}

fn next_statement(tokens: &[&str], start: usize) -> Result<Statement, PtxError> {
    let mut parens = 0usize;
    let mut init_braces = 0usize;
    let mut equals = None;
    let mut pos = start;
    while let Some(&tok) = tokens.get(pos) {
        match tok {
            "(" => parens += 1,
            ")" => parens = parens.saturating_sub(1),
            "=" if parens == 0 && equals.is_none() => equals = Some(pos),
            "{" if equals.is_some() => init_braces += 1,
            "}" if equals.is_some() && init_braces > 0 => init_braces -= 1,
            "{" => {
                return Ok(Statement {
                    end: pos,
                    next: pos + 1,
                    initializer: None,
                    opens_body: true,
                })
            }
            "}" => return Err(PtxError::Unbalanced),
            ";" if init_braces == 0 => {
                return Ok(Statement {
                    end: equals.unwrap_or(pos),
                    next: pos + 1,
                    initializer: equals.map(|e| (e + 1, pos)),
                    opens_body: false,
                })
            }
            _ => {}
        }
        pos += 1;
    }
    // Trailing tokens without a terminator: a truncated module.
    if pos > start {
        return Err(malformed("statement", tokens.get(start..pos)));
    }
    Ok(Statement {
        end: pos,
        next: pos,
        initializer: None,
        opens_body: false,
    })
}

/// Items of a flat initialiser `{a, b, c}` (or of a single value).
fn initializer_items(tokens: &[&str]) -> u64 {
    let mut depth = 0usize;
    let mut items = 0;
    let mut in_item = false;
    for tok in tokens {
        match *tok {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "," if depth <= 1 => in_item = false,
            _ if !in_item && depth <= 1 => {
                items += 1;
                in_item = true;
            }
            _ => {}
        }
    }
    items
}

/// `pos` is just past a body's `{`; returns the position after its `}`.
fn skip_body(tokens: &[&str], mut pos: usize) -> Result<usize, PtxError> {
    let mut depth = 1usize;
    while let Some(&tok) = tokens.get(pos) {
        pos += 1;
        match tok {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return Ok(pos);
                }
            }
            _ => {}
        }
    }
    Err(PtxError::Unbalanced)
}

fn malformed(what: &'static str, near: Option<&[&str]>) -> PtxError {
    let mut text = near.unwrap_or_default().join(" ");
    if text.len() > NEAR_CHARS {
        let mut cut = NEAR_CHARS;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    PtxError::Malformed { what, near: text }
}

fn is_identifier(tok: &str) -> bool {
    let mut chars = tok.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() => true,
        Some('_' | '$' | '%') => chars.next().is_some(),
        _ => false,
    }
}

/// `[.visible|.weak] .entry NAME ( .param ..., ... ) [directives]`.
fn parse_entry(decl: &[&str]) -> Result<PtxEntry, PtxError> {
    let at = decl.iter().position(|t| *t == ".entry").unwrap_or(0);
    let name = decl
        .get(at + 1)
        .filter(|t| is_identifier(t))
        .ok_or_else(|| malformed("entry name", decl.get(at..)))?;
    let mut info = FunctionInfo::default();
    if decl.get(at + 2) == Some(&"(") {
        let close = decl
            .iter()
            .skip(at + 3)
            .position(|t| *t == ")")
            .map(|p| p + at + 3)
            .ok_or_else(|| malformed("parameter list", decl.get(at..)))?;
        let list = decl.get(at + 3..close).unwrap_or_default();
        let mut offset = 0u64;
        if !list.is_empty() {
            for param in list.split(|t| *t == ",") {
                if info.params.len() >= MAX_KERNEL_PARAMS {
                    return Err(PtxError::TooLarge {
                        what: "parameter list",
                    });
                }
                let (size, align) = parse_param(param)?;
                let start = offset
                    .checked_next_multiple_of(align)
                    .ok_or(PtxError::TooLarge { what: "parameter" })?;
                offset = start
                    .checked_add(size)
                    .filter(|end| *end <= MAX_KERNEL_PARAMS_BYTES as u64)
                    .ok_or(PtxError::TooLarge {
                        what: "parameter buffer",
                    })?;
                // Both fit: the buffer is at most MAX_KERNEL_PARAMS_BYTES.
                info.params.push(ParamSlot {
                    offset: start as u32,
                    size: size as u32,
                });
            }
        }
    }
    Ok(PtxEntry {
        name: (*name).to_owned(),
        info,
    })
}

/// Size and alignment of one `.param` declaration.
fn parse_param(tokens: &[&str]) -> Result<(u64, u64), PtxError> {
    if tokens.first() != Some(&".param") {
        return Err(malformed("parameter", Some(tokens)));
    }
    let decl = parse_declarator(tokens.get(1..).unwrap_or_default(), None)
        .filter(|d| d.name.is_some() && !d.opaque)
        .ok_or_else(|| malformed("parameter", Some(tokens)))?;
    Ok((decl.size, decl.align))
}

/// The variables of one `.global` / `.const` statement (several names may
/// share one type: `.global .u32 a, b;`).
fn parse_variables(decl: &[&str], init_items: Option<u64>) -> Result<Vec<PtxVariable>, PtxError> {
    let mut parts = decl.split(|t| *t == ",");
    let first = parts.next().unwrap_or_default();
    // The qualifiers and type come before the first name; later names reuse
    // them, so rebuild each as "qualifiers + declarator".
    let name_at = first
        .iter()
        .position(|t| is_identifier(t))
        .ok_or_else(|| malformed("variable", Some(decl)))?;
    let prefix = first.get(..name_at).unwrap_or_default();
    let mut variables = Vec::new();
    let mut declarators = vec![first.get(name_at..).unwrap_or_default()];
    declarators.extend(parts);
    let last = declarators.len().saturating_sub(1);
    for (i, declarator) in declarators.into_iter().enumerate() {
        let mut tokens = prefix.to_vec();
        tokens.extend_from_slice(declarator);
        let counted = if i == last { init_items } else { None };
        let parsed = parse_declarator(&tokens, counted)
            .ok_or_else(|| malformed("variable", Some(&tokens)))?;
        if parsed.opaque {
            continue;
        }
        let name = parsed
            .name
            .ok_or_else(|| malformed("variable", Some(&tokens)))?;
        variables.push(PtxVariable {
            name: name.to_owned(),
            size: parsed.size,
        });
    }
    Ok(variables)
}

struct Declarator<'a> {
    name: Option<&'a str>,
    size: u64,
    align: u64,
    /// `.texref` and friends: handles, not memory.
    opaque: bool,
}

/// Reads `[qualifiers] [.align A] [.vN] TYPE [.ptr [.space] [.align A]] NAME
/// [dims]`. `init_items` counts the items of an initialiser, which sizes an
/// array declared with `[]`.
fn parse_declarator<'a>(tokens: &[&'a str], init_items: Option<u64>) -> Option<Declarator<'a>> {
    let mut align = None;
    let mut element = None;
    let mut lanes = 1u64;
    let mut name = None;
    let mut dims: Vec<Option<u64>> = Vec::new();
    let mut after_ptr = false;
    let mut opaque = false;
    let mut i = 0;
    while let Some(&tok) = tokens.get(i) {
        i += 1;
        match tok {
            ".align" => {
                let value = parse_number(tokens.get(i)?)?;
                i += 1;
                // After `.ptr` it is the pointee's alignment, a hint only.
                if !after_ptr {
                    if !value.is_power_of_two() || value > MAX_ALIGN {
                        return None;
                    }
                    align = Some(value);
                }
            }
            ".ptr" => after_ptr = true,
            ".v2" => lanes = 2,
            ".v4" => lanes = 4,
            ".v8" => lanes = 8,
            ".texref" | ".samplerref" | ".surfref" => opaque = true,
            ".attribute" => {
                // `.attribute(.managed)`: skip the parenthesised list.
                if tokens.get(i) == Some(&"(") {
                    let close = tokens.iter().skip(i).position(|t| *t == ")")?;
                    i += close + 1;
                }
            }
            "[" => {
                if tokens.get(i) == Some(&"]") {
                    dims.push(None);
                    i += 1;
                } else {
                    dims.push(Some(parse_number(tokens.get(i)?)?));
                    if tokens.get(i + 1) != Some(&"]") {
                        return None;
                    }
                    i += 2;
                }
            }
            _ if tok.starts_with('.') => {
                if let Some(size) = scalar_size(tok) {
                    if element.is_some() || name.is_some() {
                        return None;
                    }
                    element = Some(size);
                }
                // Other directives here are qualifiers: .global, .const,
                // .visible, .weak, .common, a pointer's state space.
            }
            _ if is_identifier(tok) && name.is_none() && dims.is_empty() => name = Some(tok),
            _ => return None,
        }
    }
    if opaque {
        return Some(Declarator {
            name,
            size: 0,
            align: 1,
            opaque,
        });
    }
    let element = element?.checked_mul(lanes)?;
    let mut size = element;
    let empty_dims = dims.iter().filter(|d| d.is_none()).count();
    for dim in &dims {
        let count = match dim {
            Some(count) => *count,
            // `x[] = {a, b, c}`: one dimension, sized by its initialiser.
            None if empty_dims == 1 && dims.len() == 1 => init_items?,
            None => return None,
        };
        size = size.checked_mul(count)?;
    }
    if size > MAX_VARIABLE_BYTES {
        return None;
    }
    Some(Declarator {
        name,
        size,
        align: align.unwrap_or(element).max(1),
        opaque,
    })
}

fn parse_number(tok: &str) -> Option<u64> {
    let tok = tok.strip_suffix(['U', 'u']).unwrap_or(tok);
    match tok.strip_prefix("0x").or_else(|| tok.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => tok.parse().ok(),
    }
}

/// Bytes of a PTX fundamental type.
fn scalar_size(ty: &str) -> Option<u64> {
    Some(match ty {
        ".b8" | ".s8" | ".u8" | ".pred" | ".e4m3" | ".e5m2" => 1,
        ".b16" | ".s16" | ".u16" | ".f16" | ".bf16" | ".e4m3x2" | ".e5m2x2" => 2,
        ".b32" | ".s32" | ".u32" | ".f32" | ".f16x2" | ".bf16x2" | ".tf32" => 4,
        ".b64" | ".s64" | ".u64" | ".f64" => 8,
        ".b128" => 16,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As nvcc 13.0 writes it (`nvcc -ptx`), with the reference kernels.
    const NVCC_PTX: &str = r#"//
// Generated by NVIDIA NVVM Compiler
//
// Compiler Build ID: CL-36260096
// Cuda compilation tools, release 13.0, V13.0.48
// Based on NVVM 7.0.1
//

.version 9.0
.target sm_90
.address_size 64

	// .globl	rgpu_vector_add
.global .align 4 .u32 counter;
.global .align 8 .b8 table[64];
.visible .global .f32 x[16];
.visible .const .align 4 .b8 coeffs[12] = {0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64};
.extern .global .align 4 .b8 elsewhere[];
.global .texref tex;
.file	1 "/home/user//kernels.cu"

.visible .entry rgpu_vector_add(
	.param .u64 .ptr .global .align 4 rgpu_vector_add_param_0,
	.param .u64 .ptr .global .align 4 rgpu_vector_add_param_1,
	.param .u64 .ptr .global .align 4 rgpu_vector_add_param_2,
	.param .u32 rgpu_vector_add_param_3
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;
	.reg .f32 	%f<4>;
	.reg .b64 	%rd<11>;

	ld.param.u64 	%rd1, [rgpu_vector_add_param_0];
	mov.u32 	%r2, %ctaid.x;
	setp.ge.u32 	%p1, %r1, %r5;
	@%p1 bra 	$L__BB0_2;
	{ // inner block
	add.f32 	%f3, %f2, %f1;
	}
$L__BB0_2:
	ret;

}
	// .globl	rgpu_empty
.visible .entry rgpu_empty()
{
	ret;
}
.weak .entry odd_layout(
	.param .u8 p0,
	.param .f64 p1,
	.param .align 16 .b8 p2[24],
	.param .u16 p3,
	.param .align 4 .b8 p4[6],
	.param .s8 p5
)
.maxntid 256, 1, 1
{
	ret;
}
.func (.param .b32 func_retval0) helper(
	.param .b32 helper_param_0
)
{
	ret;
}
.entry bare(.param .b32 a, .param .v2 .f32 b)
{
	ret;
}
"#;

    fn slots(entry: &PtxEntry) -> Vec<(u32, u32)> {
        entry
            .info
            .params
            .iter()
            .map(|p| (p.offset, p.size))
            .collect()
    }

    #[test]
    fn reads_nvcc_entries() {
        let module = parse(NVCC_PTX).unwrap();
        let names: Vec<_> = module.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            ["rgpu_vector_add", "rgpu_empty", "odd_layout", "bare"]
        );
        let add = module.entry("rgpu_vector_add").unwrap();
        assert_eq!(slots(add), [(0, 8), (8, 8), (16, 8), (24, 4)]);
        assert_eq!(add.info.buffer_size(), 28);
        assert!(module.entry("rgpu_empty").unwrap().info.params.is_empty());
        // u8 at 0, f64 aligned to 8, 16-aligned array, u16, 4-aligned array.
        assert_eq!(
            slots(module.entry("odd_layout").unwrap()),
            [(0, 1), (8, 8), (16, 24), (40, 2), (44, 6), (50, 1)]
        );
        assert_eq!(slots(module.entry("bare").unwrap()), [(0, 4), (8, 8)]);
        assert!(module.entry("helper").is_none());
    }

    #[test]
    fn reads_module_variables() {
        let module = parse(NVCC_PTX).unwrap();
        let vars: Vec<_> = module
            .variables
            .iter()
            .map(|v| (v.name.as_str(), v.size))
            .collect();
        assert_eq!(
            vars,
            [("counter", 4), ("table", 64), ("x", 64), ("coeffs", 12)]
        );
    }

    #[test]
    fn reads_variable_lists_and_sized_initialisers() {
        let text = ".version 8.0\n.target sm_80\n\
            .global .u32 a, b[3];\n\
            .global .b8 s[] = {104, 105, 0};\n\
            .global .attribute(.managed) .align 8 .u64 m;\n\
            .global .v4 .f32 v[2];\n\
            .global .u64 table[2] = {generic(a), generic(b)};\n";
        let module = parse(text).unwrap();
        let vars: Vec<_> = module
            .variables
            .iter()
            .map(|v| (v.name.as_str(), v.size))
            .collect();
        assert_eq!(
            vars,
            [
                ("a", 4),
                ("b", 12),
                ("s", 3),
                ("m", 8),
                ("v", 32),
                ("table", 16)
            ]
        );
    }

    #[test]
    fn text_detects_ptx_and_rejects_binaries() {
        let mut image = NVCC_PTX.as_bytes().to_vec();
        assert!(text(&image).is_some());
        image.push(0);
        assert_eq!(text(&image), Some(NVCC_PTX));
        assert!(text(b"\x7fELF\x02\x01\x01\0\0\0.version").is_none());
        assert!(text(&[0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0]).is_none());
        assert!(text(b"hello").is_none());
    }

    #[test]
    fn rejects_malformed_text() {
        assert_eq!(parse(".target sm_90\n"), Err(PtxError::NoVersion));
        assert_eq!(
            parse(".version 9.0\n.entry k() {"),
            Err(PtxError::Unbalanced)
        );
        assert_eq!(parse(".version 9.0\n}"), Err(PtxError::Unbalanced));
        assert!(matches!(
            parse(".version 9.0\n.entry k(.param .u32) {}"),
            Err(PtxError::Malformed { .. })
        ));
        assert!(matches!(
            parse(".version 9.0\n.entry k(.param .u32 a, .param .align 3 .b8 b[4]) {}"),
            Err(PtxError::Malformed { .. })
        ));
        assert!(matches!(
            parse(".version 9.0\n.entry k(.param .u32 a {}"),
            Err(PtxError::Malformed { .. })
        ));
        assert!(matches!(
            parse(".version 9.0\n.entry k(.param .align 8 .b8 a[40000]) {}"),
            Err(PtxError::TooLarge { .. })
        ));
        assert!(matches!(
            parse(".version 9.0\n.global .u32 g[99999999999999999999];"),
            Err(PtxError::Malformed { .. })
        ));
        assert_eq!(
            parse(".version 9.0\n.entry k() {}\n.entry k() {}"),
            Err(PtxError::Duplicate("k".into()))
        );
        assert!(matches!(
            parse(".version 9.0\n.global .u32 x"),
            Err(PtxError::Malformed { .. })
        ));
    }

    #[test]
    fn never_panics_on_garbage() {
        // Every prefix of a real module, and a few byte-level mutations of
        // it, parse or fail cleanly.
        let bytes = NVCC_PTX.as_bytes();
        for end in 0..bytes.len() {
            if let Ok(prefix) = std::str::from_utf8(&bytes[..end]) {
                let _ = parse(prefix);
            }
        }
        let mut seed = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut mutated = bytes.to_vec();
            for _ in 0..4 {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let at = seed as usize % mutated.len();
                mutated[at] = b"(){}[];,=.\"/*0 x\n\xff"[(seed >> 24) as usize % 18];
            }
            let _ = parse(&String::from_utf8_lossy(&mutated));
        }
    }
}
