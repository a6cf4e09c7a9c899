//! Zip-based Office files (OOXML): tell PPTX, XLSX and DOCX apart by their
//! `[Content_Types].xml` (or, failing that, their part names), summarise
//! slides and sheets, and flag formulas in XLSX cells and VBA projects.
//!
//! Everything here is bounded before it is read: the central directory is
//! sized from the end record first (zip64 and oversized directories are not
//! opened), every XML part is read through a byte cap, and all parts of one
//! file share one decompression budget, so a zip bomb costs at most that.
//! quick-xml expands no custom entities, so entity bombs are inert.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use quick_xml::events::Event;
use quick_xml::Reader;

use crate::result::{ContentFlag, FlagKind, SheetSummary, Summary};

/// Entries and central directory bytes an archive may have to be opened.
const MAX_ENTRIES: u64 = 10_000;
const MAX_CENTRAL_DIR_BYTES: u64 = 4 << 20;
/// Decompressed bytes read from one part, and from all parts of one file.
const PART_BYTES: u64 = 8 << 20;
const FILE_BYTES: u64 = 32 << 20;
const MAX_SHEETS: usize = 64;
const MAX_SLIDES: usize = 100;
const TITLE_CHARS: usize = 120;
const EXAMPLES: usize = 5;

pub(super) const ZIP: &str = "application/zip";

/// What the archive turned out to be.
pub(super) struct Office {
    pub media_type: &'static str,
    pub summary: Option<Summary>,
    pub flags: Vec<ContentFlag>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Xlsx,
    Pptx,
    Docx,
}

/// Inspect a file whose content starts like a zip archive.
pub(super) fn inspect(file: &mut File, size: u64) -> Office {
    let mut office = Office { media_type: ZIP, summary: None, flags: Vec::new() };
    if let Err(why) = central_directory_fits(file, size) {
        office.flags.push(incomplete(why));
        return office;
    }
    if file.seek(SeekFrom::Start(0)).is_err() {
        return office;
    }
    let Ok(zip) = zip::ZipArchive::new(&mut *file) else {
        return office;
    };
    let mut parts = Parts { zip, budget: FILE_BYTES, partial: false };
    let names: Vec<String> = parts.zip.file_names().filter_map(Result::ok).map(|n| n.into_owned()).collect();
    let macros = names.iter().filter(|n| n.to_ascii_lowercase().ends_with("vbaproject.bin")).count() as u64;
    let (kind, main_part, macro_enabled) = match content_types(&mut parts) {
        Some(found) => found,
        None => match by_part_names(&names) {
            Some((kind, main)) => (kind, main, false),
            None => return office,
        },
    };
    office.media_type = media_type(kind, macro_enabled || macros > 0);
    if macros > 0 {
        office.flags.push(ContentFlag {
            kind: FlagKind::Macros,
            count: macros,
            detail: "the document carries a VBA project (macros)".into(),
            locations: names.iter().filter(|n| n.to_ascii_lowercase().ends_with("vbaproject.bin")).take(EXAMPLES).cloned().collect(),
        });
    }
    match kind {
        Kind::Xlsx => {
            let (summary, flag) = spreadsheet(&mut parts, &main_part);
            office.summary = Some(summary);
            office.flags.extend(flag);
        }
        Kind::Pptx => office.summary = Some(presentation(&mut parts, &main_part, &names)),
        Kind::Docx => {}
    }
    if parts.partial {
        office.flags.push(incomplete(format!(
            "the archive's XML is larger than the jail reads ({} MiB per part, {} MiB per file)",
            PART_BYTES >> 20,
            FILE_BYTES >> 20
        )));
    }
    office
}

fn incomplete(why: String) -> ContentFlag {
    ContentFlag { kind: FlagKind::IncompleteScan, count: 1, detail: why, locations: vec![] }
}

fn media_type(kind: Kind, macros: bool) -> &'static str {
    match (kind, macros) {
        (Kind::Xlsx, false) => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        (Kind::Xlsx, true) => "application/vnd.ms-excel.sheet.macroEnabled.12",
        (Kind::Pptx, false) => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        (Kind::Pptx, true) => "application/vnd.ms-powerpoint.presentation.macroEnabled.12",
        (Kind::Docx, false) => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        (Kind::Docx, true) => "application/vnd.ms-word.document.macroEnabled.12",
    }
}

/// Read the end-of-central-directory record ourselves, so that an archive
/// claiming millions of entries is never handed to the zip reader (which
/// keeps one record per entry in memory).
fn central_directory_fits(file: &mut File, size: u64) -> Result<(), String> {
    const EOCD: &[u8] = b"PK\x05\x06";
    let tail_len = size.min(22 + 65_535);
    file.seek(SeekFrom::Start(size - tail_len)).map_err(|e| format!("cannot read the zip directory: {e}"))?;
    let mut tail = Vec::with_capacity(tail_len as usize);
    (&mut *file).take(tail_len).read_to_end(&mut tail).map_err(|e| format!("cannot read the zip directory: {e}"))?;
    let at = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| tail[i..].starts_with(EOCD))
        .ok_or_else(|| "no zip end record: not inspected".to_string())?;
    let u16_at = |i: usize| u16::from_le_bytes([tail[i], tail[i + 1]]) as u64;
    let u32_at = |i: usize| u32::from_le_bytes([tail[i], tail[i + 1], tail[i + 2], tail[i + 3]]) as u64;
    let (entries, dir_bytes) = (u16_at(at + 10), u32_at(at + 12));
    let zip64_locator = at >= 20 && tail[at - 20..].starts_with(b"PK\x06\x07");
    if entries == 0xFFFF || dir_bytes == 0xFFFF_FFFF || zip64_locator {
        return Err("a zip64 archive: not inspected".into());
    }
    if entries > MAX_ENTRIES || dir_bytes > MAX_CENTRAL_DIR_BYTES {
        return Err(format!("the zip directory is too large to inspect ({entries} entries, {dir_bytes} bytes)"));
    }
    Ok(())
}

/// A part is read whole (within its cap) and parsed from memory.
type XmlReader<'a> = Reader<&'a [u8]>;

/// The archive and what may still be read from it.
struct Parts<'f> {
    zip: zip::ZipArchive<&'f mut File>,
    budget: u64,
    partial: bool,
}

impl Parts<'_> {
    /// Run `f` over one XML part, read through the per-part cap and the
    /// file's remaining budget. `None` when the part is missing or unreadable.
    fn xml<T>(&mut self, name: &str, f: impl FnOnce(&mut XmlReader<'_>) -> T) -> Option<T> {
        if self.budget == 0 {
            self.partial = true;
            return None;
        }
        let cap = PART_BYTES.min(self.budget);
        let entry = self.zip.by_name(name).ok()?;
        let mut bytes = Vec::new();
        // One byte past the cap tells a part that fits from one that does not.
        entry.take(cap + 1).read_to_end(&mut bytes).ok()?;
        if bytes.len() as u64 > cap {
            bytes.truncate(cap as usize);
            self.partial = true;
        }
        self.budget -= bytes.len() as u64;
        let mut reader = Reader::from_reader(bytes.as_slice());
        Some(f(&mut reader))
    }
}

/// One XML event, reduced to what the parsers below need.
enum Ev {
    Start(String, Vec<(String, String)>),
    /// A self-closing element: a start immediately followed by its end.
    Empty(String, Vec<(String, String)>),
    End(String),
    Text(String),
}

/// Read the next event; `None` at the end of the part or on any error (a
/// malformed part simply ends the summary there).
fn next(reader: &mut XmlReader<'_>, buf: &mut Vec<u8>) -> Option<Ev> {
    loop {
        buf.clear();
        let ev = match reader.read_event_into(buf).ok()? {
            Event::Eof => return None,
            Event::Start(e) => {
                let name = local(e.name().as_ref());
                let attrs = attributes_of_interest(&name, &e);
                Ev::Start(name, attrs)
            }
            Event::Empty(e) => {
                let name = local(e.name().as_ref());
                let attrs = attributes_of_interest(&name, &e);
                Ev::Empty(name, attrs)
            }
            Event::End(e) => Ev::End(local(e.name().as_ref())),
            Event::Text(t) => Ev::Text(t.xml10_content().into_owned()),
            Event::CData(t) => Ev::Text(t.xml10_content().into_owned()),
            Event::GeneralRef(r) => {
                let name = r.xml10_content();
                let text: Cow<str> = match r.resolve_char_ref() {
                    Ok(Some(c)) => Cow::Owned(c.to_string()),
                    _ => match quick_xml::escape::resolve_predefined_entity(&name) {
                        Some(s) => Cow::Borrowed(s),
                        None => continue,
                    },
                };
                Ev::Text(text.into_owned())
            }
            _ => continue,
        };
        return Some(ev);
    }
}

fn local(name: &str) -> String {
    name.rsplit(':').next().unwrap_or(name).to_string()
}

/// Elements whose attributes the parsers read; the rest (rows, values, runs:
/// nearly every element of a big sheet) skip attribute parsing.
const WITH_ATTRIBUTES: &[&str] = &["Override", "Relationship", "sheet", "dimension", "c", "sldId", "ph"];

fn attributes_of_interest(name: &str, e: &quick_xml::events::BytesStart<'_>) -> Vec<(String, String)> {
    if WITH_ATTRIBUTES.contains(&name) {
        attributes(e)
    } else {
        Vec::new()
    }
}

/// Attributes by their full key (`r:id` keeps its prefix: relationship ids
/// are looked up by local name with [`attr_local`]).
fn attributes(e: &quick_xml::events::BytesStart<'_>) -> Vec<(String, String)> {
    e.attributes()
        .with_checks(false)
        .filter_map(Result::ok)
        .map(|a| {
            let key = a.key.as_ref().to_string();
            let value = a.normalized_value(quick_xml::XmlVersion::Implicit1_0).map(Cow::into_owned).unwrap_or_default();
            (key, value)
        })
        .collect()
}

fn attr<'a>(attrs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// A namespaced attribute by local name (`r:id`, whatever the prefix).
fn attr_local<'a>(attrs: &'a [(String, String)], local_name: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|(k, _)| k.contains(':') && k.rsplit(':').next() == Some(local_name))
        .map(|(_, v)| v.as_str())
}

/// The document kind, its main part and whether it is macro-enabled, from
/// `[Content_Types].xml`.
fn content_types(parts: &mut Parts<'_>) -> Option<(Kind, String, bool)> {
    let overrides = parts.xml("[Content_Types].xml", |r| {
        let mut buf = Vec::new();
        let mut found = Vec::new();
        while let Some(ev) = next(r, &mut buf) {
            if let Ev::Empty(name, attrs) | Ev::Start(name, attrs) = ev {
                if name == "Override" {
                    if let (Some(p), Some(t)) = (attr(&attrs, "PartName"), attr(&attrs, "ContentType")) {
                        found.push((p.to_string(), t.to_string()));
                    }
                }
            }
        }
        found
    })?;
    for (part, ctype) in overrides {
        let kind = if ctype.contains("spreadsheetml.sheet.main")
            || ctype.contains("spreadsheetml.template.main")
            || ctype.contains("ms-excel.sheet.macroEnabled.main")
        {
            Kind::Xlsx
        } else if ctype.contains("presentationml.presentation.main")
            || ctype.contains("presentationml.template.main")
            || ctype.contains("presentationml.slideshow.main")
            || ctype.contains("ms-powerpoint.presentation.macroEnabled.main")
        {
            Kind::Pptx
        } else if ctype.contains("wordprocessingml.document.main")
            || ctype.contains("wordprocessingml.template.main")
            || ctype.contains("ms-word.document.macroEnabled.main")
        {
            Kind::Docx
        } else {
            continue;
        };
        let main = part.trim_start_matches('/').to_string();
        return Some((kind, main, ctype.contains("macroEnabled")));
    }
    None
}

/// Without content types, the conventional part names.
fn by_part_names(names: &[String]) -> Option<(Kind, String)> {
    for (kind, main) in [
        (Kind::Xlsx, "xl/workbook.xml"),
        (Kind::Pptx, "ppt/presentation.xml"),
        (Kind::Docx, "word/document.xml"),
    ] {
        if names.iter().any(|n| n == main) {
            return Some((kind, main.to_string()));
        }
    }
    None
}

/// `dir/_rels/name.rels` for part `dir/name`.
fn rels_of(part: &str) -> String {
    match part.rsplit_once('/') {
        Some((dir, name)) => format!("{dir}/_rels/{name}.rels"),
        None => format!("_rels/{part}.rels"),
    }
}

/// Relationship id → (part name, type), targets resolved against `part`'s folder.
fn relationships(parts: &mut Parts<'_>, part: &str) -> BTreeMap<String, (String, String)> {
    let base = part.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
    parts
        .xml(&rels_of(part), |r| {
            let mut buf = Vec::new();
            let mut map = BTreeMap::new();
            while let Some(ev) = next(r, &mut buf) {
                if let Ev::Empty(name, attrs) | Ev::Start(name, attrs) = ev {
                    if name != "Relationship" || attr(&attrs, "TargetMode") == Some("External") {
                        continue;
                    }
                    if let (Some(id), Some(target)) = (attr(&attrs, "Id"), attr(&attrs, "Target")) {
                        let ty = attr(&attrs, "Type").unwrap_or("").to_string();
                        map.insert(id.to_string(), (resolve(base, target), ty));
                    }
                }
            }
            map
        })
        .unwrap_or_default()
}

/// Resolve a relationship target (`worksheets/sheet1.xml`, `../x`, `/xl/y`).
fn resolve(base: &str, target: &str) -> String {
    let mut stack: Vec<&str> = if target.starts_with('/') { vec![] } else { base.split('/').filter(|s| !s.is_empty()).collect() };
    for seg in target.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                stack.pop();
            }
            s => stack.push(s),
        }
    }
    stack.join("/")
}

/// Whether a cell's text would start a formula (see csv.rs for the rule).
fn starts_formula(text: &str) -> bool {
    match text.as_bytes().first() {
        Some(b'=' | b'@' | b'\t' | b'\r') => true,
        Some(b'+' | b'-') => !super::csv::is_number_text(text),
        _ => false,
    }
}

struct FormulaHits {
    formulas: u64,
    strings: u64,
    locations: Vec<String>,
}

impl FormulaHits {
    fn add(&mut self, formula: bool, location: String) {
        if formula {
            self.formulas += 1;
        } else {
            self.strings += 1;
        }
        if self.locations.len() < EXAMPLES {
            self.locations.push(location);
        }
    }
}

fn spreadsheet(parts: &mut Parts<'_>, workbook: &str) -> (Summary, Option<ContentFlag>) {
    let rels = relationships(parts, workbook);
    let sheets: Vec<(String, Option<String>)> = parts
        .xml(workbook, |r| {
            let mut buf = Vec::new();
            let mut list = Vec::new();
            while let Some(ev) = next(r, &mut buf) {
                if let Ev::Empty(name, attrs) | Ev::Start(name, attrs) = ev {
                    if name == "sheet" {
                        let sheet_name = attr(&attrs, "name").unwrap_or("").to_string();
                        let target = attr_local(&attrs, "id").and_then(|id| rels.get(id)).map(|(t, _)| t.clone());
                        list.push((sheet_name, target));
                    }
                }
            }
            list
        })
        .unwrap_or_default();
    let shared_part = rels
        .values()
        .find(|(_, ty)| ty.ends_with("/sharedStrings"))
        .map(|(t, _)| t.clone())
        .unwrap_or_else(|| resolve(workbook.rsplit_once('/').map(|(d, _)| d).unwrap_or(""), "sharedStrings.xml"));
    let flagged_shared = shared_strings(parts, &shared_part);
    let mut hits = FormulaHits { formulas: 0, strings: 0, locations: Vec::new() };
    let mut summaries = Vec::new();
    for (name, target) in sheets.iter().take(MAX_SHEETS) {
        let shown = super::printable(name, 64);
        let size = target.as_ref().and_then(|t| parts.xml(t, |r| sheet(r, &shown, &flagged_shared, &mut hits)));
        let (dimension, rows, columns) = size.unwrap_or((None, 0, 0));
        summaries.push(SheetSummary { name: shown, dimension, rows, columns });
    }
    let partial = sheets.len() > MAX_SHEETS;
    let flag = (hits.formulas + hits.strings > 0).then(|| ContentFlag {
        kind: FlagKind::FormulaInjection,
        count: hits.formulas + hits.strings,
        detail: format!(
            "{} cells hold a formula and {} text cells start one; the jail does not rewrite XLSX files",
            hits.formulas, hits.strings
        ),
        locations: hits.locations,
    });
    (Summary::Xlsx { sheets: summaries, partial }, flag)
}

/// Indices of shared strings that would start a formula.
fn shared_strings(parts: &mut Parts<'_>, part: &str) -> HashSet<u64> {
    parts
        .xml(part, |r| {
            let mut buf = Vec::new();
            let mut flagged = HashSet::new();
            let (mut index, mut in_t, mut phonetic) = (0u64, false, false);
            let mut text = String::new();
            while let Some(ev) = next(r, &mut buf) {
                match ev {
                    Ev::Start(n, _) if n == "si" => text.clear(),
                    Ev::Start(n, _) if n == "t" => in_t = true,
                    Ev::Start(n, _) if n == "rPh" => phonetic = true,
                    Ev::End(n) if n == "t" => in_t = false,
                    Ev::End(n) if n == "rPh" => phonetic = false,
                    Ev::End(n) if n == "si" => {
                        if starts_formula(&text) {
                            flagged.insert(index);
                        }
                        index += 1;
                    }
                    Ev::Empty(n, _) if n == "si" => index += 1,
                    Ev::Text(t) if in_t && !phonetic && text.len() < 80 => text.push_str(&t),
                    _ => {}
                }
            }
            flagged
        })
        .unwrap_or_default()
}

/// One worksheet: its dimension and size, and its formula cells.
fn sheet(r: &mut XmlReader<'_>, sheet_name: &str, flagged_shared: &HashSet<u64>, hits: &mut FormulaHits) -> (Option<String>, u64, u64) {
    let mut buf = Vec::new();
    let mut dimension = None;
    let (mut max_row, mut max_col) = (0u64, 0u64);
    let mut cell = String::new();
    let mut cell_type = String::new();
    let (mut in_v, mut in_is_t, mut had_formula) = (false, false, false);
    let mut text = String::new();
    while let Some(ev) = next(r, &mut buf) {
        match ev {
            Ev::Empty(n, a) | Ev::Start(n, a) if n == "dimension" => {
                dimension = attr(&a, "ref").map(|s| super::printable(s, 32));
            }
            Ev::Start(n, a) | Ev::Empty(n, a) if n == "c" => {
                cell = attr(&a, "r").unwrap_or("").to_string();
                cell_type = attr(&a, "t").unwrap_or("n").to_string();
                had_formula = false;
                text.clear();
                if let Some((row, col)) = cell_position(&cell) {
                    max_row = max_row.max(row);
                    max_col = max_col.max(col);
                }
            }
            Ev::Start(n, _) | Ev::Empty(n, _) if n == "f" && !had_formula => {
                had_formula = true;
                hits.add(true, format!("{sheet_name}!{}", super::printable(&cell, 16)));
            }
            Ev::Start(n, _) if n == "v" => in_v = true,
            Ev::End(n) if n == "v" => in_v = false,
            Ev::Start(n, _) if n == "t" => in_is_t = cell_type == "inlineStr",
            Ev::End(n) if n == "t" => in_is_t = false,
            Ev::Text(t)
                if in_v && cell_type == "s" && !had_formula && t.trim().parse::<u64>().is_ok_and(|i| flagged_shared.contains(&i)) =>
            {
                hits.add(false, format!("{sheet_name}!{}", super::printable(&cell, 16)));
            }
            Ev::Text(t) if in_is_t && text.len() < 80 => text.push_str(&t),
            Ev::End(n) if n == "is" && !had_formula && starts_formula(&text) => {
                hits.add(false, format!("{sheet_name}!{}", super::printable(&cell, 16)));
            }
            _ => {}
        }
    }
    let (rows, columns) = dimension
        .as_deref()
        .and_then(range_size)
        .unwrap_or((max_row, max_col));
    (dimension, rows, columns)
}

/// `B3` → (3, 2).
fn cell_position(r: &str) -> Option<(u64, u64)> {
    let split = r.find(|c: char| c.is_ascii_digit())?;
    let (letters, digits) = r.split_at(split);
    if letters.is_empty() || letters.len() > 3 {
        return None;
    }
    let col = letters.bytes().try_fold(0u64, |acc, b| {
        b.is_ascii_uppercase().then(|| acc * 26 + u64::from(b - b'A' + 1))
    })?;
    let row = digits.parse().ok()?;
    Some((row, col))
}

/// `A1:C10` → (10, 3); `B2` → (1, 1).
fn range_size(range: &str) -> Option<(u64, u64)> {
    let (a, b) = range.split_once(':').unwrap_or((range, range));
    let (r1, c1) = cell_position(a)?;
    let (r2, c2) = cell_position(b)?;
    Some((r2.abs_diff(r1) + 1, c2.abs_diff(c1) + 1))
}

fn presentation(parts: &mut Parts<'_>, main: &str, names: &[String]) -> Summary {
    let rels = relationships(parts, main);
    let mut slides: Vec<String> = parts
        .xml(main, |r| {
            let mut buf = Vec::new();
            let mut ids = Vec::new();
            while let Some(ev) = next(r, &mut buf) {
                if let Ev::Empty(n, a) | Ev::Start(n, a) = ev {
                    if n == "sldId" {
                        if let Some(id) = attr_local(&a, "id") {
                            ids.push(id.to_string());
                        }
                    }
                }
            }
            ids
        })
        .unwrap_or_default()
        .iter()
        .filter_map(|id| rels.get(id).map(|(t, _)| t.clone()))
        .collect();
    if slides.is_empty() {
        // No slide list: take ppt/slides/slideN.xml in number order.
        let mut numbered: Vec<(u64, String)> = names
            .iter()
            .filter_map(|n| {
                let num = n.strip_prefix("ppt/slides/slide")?.strip_suffix(".xml")?;
                Some((num.parse().ok()?, n.clone()))
            })
            .collect();
        numbered.sort();
        slides = numbered.into_iter().map(|(_, n)| n).collect();
    }
    let mut titles = Vec::new();
    for slide in slides.iter().take(MAX_SLIDES) {
        titles.push(parts.xml(slide, slide_title).flatten());
    }
    Summary::Pptx { slides: slides.len() as u64, titles, partial: slides.len() > MAX_SLIDES }
}

/// The text of the slide's title placeholder (`<p:ph type="title|ctrTitle">`).
fn slide_title(r: &mut XmlReader<'_>) -> Option<String> {
    let mut buf = Vec::new();
    let (mut in_shape, mut is_title, mut in_t) = (false, false, false);
    let mut text = String::new();
    while let Some(ev) = next(r, &mut buf) {
        match ev {
            Ev::Start(n, _) if n == "sp" => {
                in_shape = true;
                is_title = false;
                text.clear();
            }
            Ev::Empty(n, a) | Ev::Start(n, a) if n == "ph" && in_shape => {
                is_title = matches!(attr(&a, "type"), Some("title" | "ctrTitle"));
            }
            Ev::Start(n, _) if n == "t" => in_t = true,
            Ev::End(n) if n == "t" => in_t = false,
            Ev::End(n) if n == "p" && in_shape && !text.is_empty() => text.push(' '),
            Ev::Text(t) if in_t && in_shape && text.len() < TITLE_CHARS * 4 => text.push_str(&t),
            Ev::End(n) if n == "sp" => {
                if is_title {
                    let title = text.trim();
                    return (!title.is_empty()).then(|| super::printable(title, TITLE_CHARS));
                }
                in_shape = false;
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relationship_targets_resolve_against_the_part_folder() {
        assert_eq!(resolve("xl", "worksheets/sheet1.xml"), "xl/worksheets/sheet1.xml");
        assert_eq!(resolve("ppt", "/ppt/slides/slide2.xml"), "ppt/slides/slide2.xml");
        assert_eq!(resolve("ppt/slides", "../media/a.png"), "ppt/media/a.png");
        assert_eq!(rels_of("xl/workbook.xml"), "xl/_rels/workbook.xml.rels");
    }

    #[test]
    fn cell_references_give_sheet_sizes() {
        assert_eq!(cell_position("B3"), Some((3, 2)));
        assert_eq!(cell_position("AA10"), Some((10, 27)));
        assert_eq!(cell_position("b3"), None);
        assert_eq!(range_size("A1:C10"), Some((10, 3)));
        assert_eq!(range_size("B2"), Some((1, 1)));
    }

    #[test]
    fn text_that_starts_a_formula_is_told_from_numbers() {
        assert!(starts_formula("=1+1"));
        assert!(starts_formula("@SUM(A1)"));
        assert!(starts_formula("-2+3"));
        assert!(!starts_formula("-2.5"));
        assert!(!starts_formula("total"));
        assert!(!starts_formula(""));
    }
}
