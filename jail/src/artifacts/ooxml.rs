//! Zip-based Office files (OOXML): tell PPTX, XLSX and DOCX apart by their
//! `[Content_Types].xml` (or, failing that, their part names), summarise
//! slides and sheets, and flag formulas in XLSX cells and VBA projects.
//!
//! Everything here is bounded before it is read: the zip directory is
//! checked by `zipdir` before the zip crate sees the file (one end record,
//! at most 10000 entries and 4 MiB of directory); every XML part is read
//! through a byte cap and all parts of one file share one decompression
//! budget, so a zip bomb costs at most that; the XML reader follows at most
//! [`MAX_XML_DEPTH`] levels and [`MAX_XML_ATTRIBUTES`] attributes per
//! element; every list built from a part has a cap; and the file's
//! [`Deadline`] is checked between parts and every 256 XML events. Past
//! any of these the file is flagged `incomplete_scan`. quick-xml expands no
//! custom entities, so entity bombs are inert.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Seek, SeekFrom};

use quick_xml::events::Event;
use quick_xml::Reader;

use super::budget::{incomplete, Deadline, Ticker, MAX_XML_ATTRIBUTES, MAX_XML_DEPTH};
use super::zipdir;
use crate::result::{ContentFlag, FlagKind, SheetSummary, Summary};

/// Decompressed bytes read from one part, and from all parts of one file.
const PART_BYTES: u64 = 8 << 20;
const FILE_BYTES: u64 = 32 << 20;
const MAX_SHEETS: usize = 64;
const MAX_SLIDES: usize = 100;
/// Content-type overrides, relationships of one part, and flagged shared
/// strings remembered; past these the file is flagged `incomplete_scan`.
const MAX_OVERRIDES: usize = 1_000;
const MAX_RELATIONSHIPS: usize = 10_000;
const MAX_FLAGGED_SHARED: usize = 100_000;
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

/// Why the archive was read only in part.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cut {
    Bytes,
    Depth,
    Lists,
    Time,
}

/// Inspect a `size`-byte file whose content starts like a zip archive.
pub(super) fn inspect<R: Read + Seek>(file: &mut R, size: u64, deadline: Deadline) -> Office {
    let mut office = Office { media_type: ZIP, summary: None, flags: Vec::new() };
    if let Err(why) = zipdir::check(file, size) {
        office.flags.push(incomplete(format!("{why}: not inspected")));
        return office;
    }
    if file.seek(SeekFrom::Start(0)).is_err() {
        return office;
    }
    let Ok(zip) = zip::ZipArchive::new(&mut *file) else {
        return office;
    };
    let mut parts = Parts { zip, budget: FILE_BYTES, ticker: Ticker::new(deadline), cut: None };
    let names: Vec<String> = parts.zip.file_names().filter_map(Result::ok).map(|n| n.into_owned()).collect();
    let macros = names.iter().filter(|n| n.to_ascii_lowercase().ends_with("vbaproject.bin")).count() as u64;
    let (kind, main_part, macro_enabled) = match content_types(&mut parts) {
        Some(found) => found,
        None => match by_part_names(&names) {
            Some((kind, main)) => (kind, main, false),
            None => {
                office.flags.extend(parts.incomplete(&deadline));
                return office;
            }
        },
    };
    office.media_type = media_type(kind, macro_enabled || macros > 0);
    if macros > 0 {
        office.flags.push(ContentFlag {
            kind: FlagKind::Macros,
            count: macros,
            detail: "the document carries a VBA project (macros)".into(),
            locations: names
                .iter()
                .filter(|n| n.to_ascii_lowercase().ends_with("vbaproject.bin"))
                .take(EXAMPLES)
                .cloned()
                .collect(),
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
    office.flags.extend(parts.incomplete(&deadline));
    office
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

/// The archive and what may still be read from it.
struct Parts<'f, R> {
    zip: zip::ZipArchive<&'f mut R>,
    budget: u64,
    ticker: Ticker,
    /// The first reason a part was read short, if any.
    cut: Option<Cut>,
}

impl<R: Read + Seek> Parts<'_, R> {
    fn cut(&mut self, why: Cut) {
        self.cut.get_or_insert(why);
    }

    /// Run `f` over one XML part, read through the per-part cap and the
    /// file's remaining budget. `None` when the part is missing or unreadable.
    fn xml<T>(&mut self, name: &str, f: impl FnOnce(&mut Xml<'_>) -> T) -> Option<T> {
        if self.budget == 0 {
            self.cut(Cut::Bytes);
            return None;
        }
        if self.ticker.stopped() {
            return None;
        }
        let cap = PART_BYTES.min(self.budget);
        let entry = self.zip.by_name(name).ok()?;
        // The claimed size only sizes the buffer, never past the cap.
        let mut bytes = Vec::with_capacity(entry.size().min(cap) as usize + 1);
        // One byte past the cap tells a part that fits from one that does not.
        entry.take(cap + 1).read_to_end(&mut bytes).ok()?;
        if bytes.len() as u64 > cap {
            bytes.truncate(cap as usize);
            self.cut(Cut::Bytes);
        }
        self.budget -= bytes.len() as u64;
        let mut xml = Xml {
            reader: Reader::from_reader(bytes.as_slice()),
            buf: Vec::new(),
            depth: 0,
            ticker: &mut self.ticker,
            cut: None,
        };
        let out = f(&mut xml);
        if let Some(why) = xml.cut {
            self.cut(why);
        }
        Some(out)
    }

    /// The `incomplete_scan` flag, when anything was cut.
    fn incomplete(&self, deadline: &Deadline) -> Option<ContentFlag> {
        let detail = match self.cut? {
            Cut::Bytes => format!(
                "the archive's XML is larger than the jail reads ({} MiB per part, {} MiB per file)",
                PART_BYTES >> 20,
                FILE_BYTES >> 20
            ),
            Cut::Depth => format!("the archive's XML nests deeper than the {MAX_XML_DEPTH} levels the jail follows"),
            Cut::Lists => "the archive's XML lists more parts, relationships or strings than the jail keeps".into(),
            Cut::Time => deadline.reason("reading the archive"),
        };
        Some(incomplete(detail))
    }
}

/// One part's XML reader, with the depth, time and list caps of the file.
struct Xml<'a> {
    reader: Reader<&'a [u8]>,
    buf: Vec<u8>,
    depth: usize,
    ticker: &'a mut Ticker,
    cut: Option<Cut>,
}

/// One XML event, reduced to what the parsers below need.
enum Ev {
    Start(String, Vec<(String, String)>),
    /// A self-closing element: a start immediately followed by its end.
    Empty(String, Vec<(String, String)>),
    End(String),
    Text(String),
}

impl Xml<'_> {
    fn cut(&mut self, why: Cut) {
        self.cut.get_or_insert(why);
    }

    /// Push to a capped list; past the cap the part counts as cut.
    fn push_capped<T>(&mut self, list: &mut Vec<T>, cap: usize, item: T) {
        if list.len() < cap {
            list.push(item);
        } else {
            self.cut(Cut::Lists);
        }
    }

    /// Read the next event; `None` at the end of the part, on any error (a
    /// malformed part simply ends the summary there), or past the depth or
    /// time budget.
    fn next(&mut self) -> Option<Ev> {
        loop {
            if self.ticker.tick() {
                self.cut(Cut::Time);
                return None;
            }
            self.buf.clear();
            let ev = match self.reader.read_event_into(&mut self.buf).ok()? {
                Event::Eof => return None,
                Event::Start(e) => {
                    self.depth += 1;
                    if self.depth > MAX_XML_DEPTH {
                        self.cut(Cut::Depth);
                        return None;
                    }
                    let name = local(e.name().as_ref());
                    let attrs = attributes_of_interest(&name, &e);
                    Ev::Start(name, attrs)
                }
                Event::Empty(e) => {
                    let name = local(e.name().as_ref());
                    let attrs = attributes_of_interest(&name, &e);
                    Ev::Empty(name, attrs)
                }
                Event::End(e) => {
                    self.depth = self.depth.saturating_sub(1);
                    Ev::End(local(e.name().as_ref()))
                }
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
        .take(MAX_XML_ATTRIBUTES)
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
fn content_types<R: Read + Seek>(parts: &mut Parts<'_, R>) -> Option<(Kind, String, bool)> {
    let overrides = parts.xml("[Content_Types].xml", |r| {
        let mut found = Vec::new();
        while let Some(ev) = r.next() {
            if let Ev::Empty(name, attrs) | Ev::Start(name, attrs) = ev {
                if name == "Override" {
                    if let (Some(p), Some(t)) = (attr(&attrs, "PartName"), attr(&attrs, "ContentType")) {
                        let item = (p.to_string(), t.to_string());
                        r.push_capped(&mut found, MAX_OVERRIDES, item);
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
fn relationships<R: Read + Seek>(parts: &mut Parts<'_, R>, part: &str) -> BTreeMap<String, (String, String)> {
    let base = part.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
    parts
        .xml(&rels_of(part), |r| {
            let mut map = BTreeMap::new();
            while let Some(ev) = r.next() {
                if let Ev::Empty(name, attrs) | Ev::Start(name, attrs) = ev {
                    if name != "Relationship" || attr(&attrs, "TargetMode") == Some("External") {
                        continue;
                    }
                    if let (Some(id), Some(target)) = (attr(&attrs, "Id"), attr(&attrs, "Target")) {
                        if map.len() >= MAX_RELATIONSHIPS {
                            r.cut(Cut::Lists);
                            break;
                        }
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
    let mut stack: Vec<&str> = if target.starts_with('/') {
        vec![]
    } else {
        base.split('/').filter(|s| !s.is_empty()).collect()
    };
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

fn spreadsheet<R: Read + Seek>(parts: &mut Parts<'_, R>, workbook: &str) -> (Summary, Option<ContentFlag>) {
    let rels = relationships(parts, workbook);
    let sheets: Vec<(String, Option<String>)> = parts
        .xml(workbook, |r| {
            let mut list = Vec::new();
            while let Some(ev) = r.next() {
                if let Ev::Empty(name, attrs) | Ev::Start(name, attrs) = ev {
                    if name == "sheet" {
                        let sheet_name = attr(&attrs, "name").unwrap_or("").to_string();
                        let target = attr_local(&attrs, "id").and_then(|id| rels.get(id)).map(|(t, _)| t.clone());
                        // One past the summarised sheets tells `partial`.
                        if list.len() > MAX_SHEETS {
                            break;
                        }
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
        let shown = super::text::printable(name, 64);
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
fn shared_strings<R: Read + Seek>(parts: &mut Parts<'_, R>, part: &str) -> HashSet<u64> {
    parts
        .xml(part, |r| {
            let mut flagged = HashSet::new();
            let (mut index, mut in_t, mut phonetic) = (0u64, false, false);
            let mut text = String::new();
            while let Some(ev) = r.next() {
                match ev {
                    Ev::Start(n, _) if n == "si" => text.clear(),
                    Ev::Start(n, _) if n == "t" => in_t = true,
                    Ev::Start(n, _) if n == "rPh" => phonetic = true,
                    Ev::End(n) if n == "t" => in_t = false,
                    Ev::End(n) if n == "rPh" => phonetic = false,
                    Ev::End(n) if n == "si" => {
                        if starts_formula(&text) {
                            if flagged.len() >= MAX_FLAGGED_SHARED {
                                r.cut(Cut::Lists);
                                break;
                            }
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
fn sheet(r: &mut Xml<'_>, sheet_name: &str, flagged_shared: &HashSet<u64>, hits: &mut FormulaHits) -> (Option<String>, u64, u64) {
    let mut dimension = None;
    let (mut max_row, mut max_col) = (0u64, 0u64);
    let mut cell = String::new();
    let mut cell_type = String::new();
    let (mut in_v, mut in_is_t, mut had_formula) = (false, false, false);
    let mut text = String::new();
    while let Some(ev) = r.next() {
        match ev {
            Ev::Empty(n, a) | Ev::Start(n, a) if n == "dimension" => {
                dimension = attr(&a, "ref").map(|s| super::text::printable(s, 32));
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
                hits.add(true, format!("{sheet_name}!{}", super::text::printable(&cell, 16)));
            }
            Ev::Start(n, _) if n == "v" => in_v = true,
            Ev::End(n) if n == "v" => in_v = false,
            Ev::Start(n, _) if n == "t" => in_is_t = cell_type == "inlineStr",
            Ev::End(n) if n == "t" => in_is_t = false,
            Ev::Text(t)
                if in_v
                    && cell_type == "s"
                    && !had_formula
                    && t.trim().parse::<u64>().is_ok_and(|i| flagged_shared.contains(&i)) =>
            {
                hits.add(false, format!("{sheet_name}!{}", super::text::printable(&cell, 16)));
            }
            Ev::Text(t) if in_is_t && text.len() < 80 => text.push_str(&t),
            Ev::End(n) if n == "is" && !had_formula && starts_formula(&text) => {
                hits.add(false, format!("{sheet_name}!{}", super::text::printable(&cell, 16)));
            }
            _ => {}
        }
    }
    let (rows, columns) = dimension.as_deref().and_then(range_size).unwrap_or((max_row, max_col));
    (dimension, rows, columns)
}

/// `B3` → (3, 2).
fn cell_position(r: &str) -> Option<(u64, u64)> {
    let split = r.find(|c: char| c.is_ascii_digit())?;
    let (letters, digits) = r.split_at(split);
    if letters.is_empty() || letters.len() > 3 {
        return None;
    }
    let col = letters
        .bytes()
        .try_fold(0u64, |acc, b| b.is_ascii_uppercase().then(|| acc * 26 + u64::from(b - b'A' + 1)))?;
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

fn presentation<R: Read + Seek>(parts: &mut Parts<'_, R>, main: &str, names: &[String]) -> Summary {
    let rels = relationships(parts, main);
    let mut slides: Vec<String> = parts
        .xml(main, |r| {
            let mut ids = Vec::new();
            while let Some(ev) = r.next() {
                if let Ev::Empty(n, a) | Ev::Start(n, a) = ev {
                    if n == "sldId" {
                        if let Some(id) = attr_local(&a, "id") {
                            let id = id.to_string();
                            r.push_capped(&mut ids, MAX_RELATIONSHIPS, id);
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
fn slide_title(r: &mut Xml<'_>) -> Option<String> {
    let (mut in_shape, mut is_title, mut in_t) = (false, false, false);
    let mut text = String::new();
    while let Some(ev) = r.next() {
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
                    return (!title.is_empty()).then(|| super::text::printable(title, TITLE_CHARS));
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
    use std::io::{Cursor, Write};
    use std::time::Instant;

    const CT_MAIN: &str = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml";

    /// An XLSX of one sheet (`sheet` is its whole XML), `extra` parts added or
    /// replacing the default ones.
    fn xlsx(sheet: &str, extra: &[(&str, String)]) -> Vec<u8> {
        let types = format!("<Types><Override PartName=\"/xl/workbook.xml\" ContentType=\"{CT_MAIN}\"/></Types>");
        let wb = "<workbook xmlns:r=\"r\"><sheets><sheet name=\"S\" sheetId=\"1\" r:id=\"rId1\"/></sheets></workbook>";
        let rels =
            "<Relationships><Relationship Id=\"rId1\" Type=\"t/worksheet\" Target=\"worksheets/sheet1.xml\"/></Relationships>";
        let mut parts = vec![
            ("[Content_Types].xml", types),
            ("xl/workbook.xml", wb.to_string()),
            ("xl/_rels/workbook.xml.rels", rels.to_string()),
            ("xl/worksheets/sheet1.xml", sheet.to_string()),
        ];
        for (name, data) in extra {
            parts.retain(|(n, _)| n != name);
            parts.push((name, data.clone()));
        }
        let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, data) in parts {
            z.start_file(name, zip::write::SimpleFileOptions::default()).unwrap();
            z.write_all(data.as_bytes()).unwrap();
        }
        z.finish().unwrap().into_inner()
    }

    fn run(f: &[u8], deadline: Deadline) -> Office {
        inspect(&mut Cursor::new(f), f.len() as u64, deadline)
    }

    fn incomplete_detail(o: &Office) -> Option<&str> {
        o.flags.iter().find(|f| f.kind == FlagKind::IncompleteScan).map(|f| f.detail.as_str())
    }

    #[test]
    fn a_zip64_office_file_with_a_decoy_end_record_is_not_opened() {
        // Issue 15's attack, scaled down: past the entry cap, so the old
        // check of the last signature let the zip crate load it all.
        let f = zipdir::tests::zip64_with_decoy(zipdir::MAX_ENTRIES * 2);
        let started = Instant::now();
        let o = run(&f, Deadline::from_now());
        let detail = incomplete_detail(&o).unwrap_or_else(|| panic!("no incomplete_scan: {:?}", o.flags));
        assert!(detail.contains("decoys"), "{detail}");
        assert_eq!((o.media_type, o.summary.is_none()), (ZIP, true));
        assert!(started.elapsed().as_millis() < 500, "{:?}", started.elapsed());
    }

    #[test]
    fn a_plain_xlsx_is_summarised_without_an_incomplete_flag() {
        let f = xlsx(
            "<worksheet><dimension ref=\"A1:B2\"/><sheetData><row><c r=\"A1\"><f>1+1</f></c></row></sheetData></worksheet>",
            &[],
        );
        let o = run(&f, Deadline::from_now());
        assert_eq!(incomplete_detail(&o), None, "{:?}", o.flags);
        let Some(Summary::Xlsx { sheets, .. }) = o.summary else { panic!("{:?}", o.summary) };
        assert_eq!((sheets[0].rows, sheets[0].columns), (2, 2));
        assert!(o.flags.iter().any(|f| f.kind == FlagKind::FormulaInjection));
    }

    #[test]
    fn deep_nesting_long_lists_and_a_passed_deadline_cut_the_scan_and_say_why() {
        let deep = format!("<worksheet>{}</worksheet>", "<x>".repeat(MAX_XML_DEPTH + 1));
        let o = run(&xlsx(&deep, &[]), Deadline::from_now());
        assert!(incomplete_detail(&o).is_some_and(|d| d.contains("deeper")), "{:?}", o.flags);

        let rels: String = (0..MAX_RELATIONSHIPS + 1).map(|i| format!("<Relationship Id=\"x{i}\" Target=\"y\"/>")).collect();
        let o = run(
            &xlsx("<worksheet/>", &[("xl/_rels/workbook.xml.rels", format!("<Relationships>{rels}</Relationships>"))]),
            Deadline::from_now(),
        );
        assert!(incomplete_detail(&o).is_some_and(|d| d.contains("lists more")), "{:?}", o.flags);

        let rows = "<row><c r=\"A1\"><v>1</v></c></row>".repeat(1000);
        let f = xlsx(&format!("<worksheet><sheetData>{rows}</sheetData></worksheet>"), &[]);
        let o = run(&f, Deadline::at(Instant::now()));
        assert!(incomplete_detail(&o).is_some_and(|d| d.contains("time budget")), "{:?}", o.flags);
    }

    #[test]
    fn a_part_larger_than_the_cap_is_read_up_to_it_and_flagged() {
        // 8 MiB of the part is read, however large it claims or inflates
        // to; no clock stops this one (a deadline an hour away, no CPU budget).
        let rows = "<row><c r=\"A1\"><v>1</v></c></row>".repeat((PART_BYTES as usize) / 30 + 1);
        let f = xlsx(&format!("<worksheet><sheetData>{rows}</sheetData></worksheet>"), &[]);
        assert!(f.len() < (PART_BYTES as usize) / 10, "the test's part should compress: {}", f.len());
        let o = run(&f, Deadline::at(Instant::now() + std::time::Duration::from_secs(3600)));
        assert!(incomplete_detail(&o).is_some_and(|d| d.contains("larger than the jail reads")), "{:?}", o.flags);
    }

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
