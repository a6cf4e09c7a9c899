//! The zip directory, checked by our own code before the zip crate sees the
//! file: one end record, the zip64 records it points to, and every central
//! header, all within fixed caps.
//!
//! Why not trust the last end record: the zip crate searches the last 64 KiB
//! for end-of-central-directory signatures and, when one does not parse or
//! its directory does not read, falls back to an earlier one. A decoy record
//! after the real one (issue 15: one entry and a comment length past the end
//! of the file) passed a check of the last signature, and the crate then
//! loaded the real zip64 directory's 1.9 million entries (490 MiB, 7 s).
//!
//! So the file must be unambiguous: exactly one end signature in the tail
//! the crate searches, its comment ending exactly at the end of the file; a
//! zip64 locator and record exactly where the end record says, with nothing
//! between them; a directory of at most [`MAX_ENTRIES`] headers and
//! [`MAX_DIR_BYTES`] that ends exactly where the end record (or the zip64
//! record) starts; and every one of its headers walked and found where the
//! previous one ends. Then there is no other record the crate could fall
//! back to, and since the directory abuts its end record the crate refuses
//! rather than falls back if it disagrees with us on a header. The walk
//! reads the directory once in 64 KiB pieces and keeps nothing.

use std::io::{self, BufReader, Read, Seek, SeekFrom};

/// Entries and directory bytes an archive may have to be opened.
pub(super) const MAX_ENTRIES: u64 = 10_000;
pub(super) const MAX_DIR_BYTES: u64 = 4 << 20;
/// The tail searched for end records: the zip crate looks in the last 64 KiB
/// plus its record (`min_eocd_position` in zip's `get_metadata`); the extra
/// KiB only makes us stricter.
const TAIL: u64 = (1 << 16) + 1024;

const EOCD: &[u8; 4] = b"PK\x05\x06";
const LOCATOR: &[u8; 4] = b"PK\x06\x07";
const EOCD64: &[u8; 4] = b"PK\x06\x06";
const HEADER: &[u8; 4] = b"PK\x01\x02";
const EOCD_LEN: u64 = 22;
const LOCATOR_LEN: u64 = 20;
/// A zip64 end record without extensible data.
const EOCD64_LEN: u64 = 56;
const HEADER_LEN: u64 = 46;

/// What the end records say, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Directory {
    pub entries: u64,
    pub offset: u64,
    pub bytes: u64,
    pub zip64: bool,
}

/// Why an archive is not handed to the zip reader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum DirError {
    #[error("cannot read the zip directory: {0}")]
    Read(String),
    #[error("no zip end-of-directory record in the last 64 KiB")]
    NoEndRecord,
    #[error("{0} zip end-of-directory records in the last 64 KiB (all but one are decoys)")]
    SeveralEndRecords(usize),
    #[error("the zip end record's comment ({comment} bytes) does not end the file ({after} bytes follow the record)")]
    CommentLength { comment: u64, after: u64 },
    #[error("a multi-disk zip archive")]
    MultiDisk,
    #[error("the zip64 {0}")]
    Zip64(&'static str),
    #[error("the zip directory has {0} entries, over the {MAX_ENTRIES} the jail inspects")]
    TooManyEntries(u64),
    #[error("the zip directory is {0} bytes, over the {mib} MiB the jail inspects", mib = MAX_DIR_BYTES >> 20)]
    TooLarge(u64),
    #[error("the zip directory ({bytes} bytes at {offset}) does not end where its end record starts ({end})")]
    Misplaced { offset: u64, bytes: u64, end: u64 },
    #[error("zip directory header {index} of {entries}: {why}")]
    Header { index: u64, entries: u64, why: &'static str },
    #[error("the zip directory has {0} bytes after its last header")]
    Trailing(u64),
}

fn read_err(e: io::Error) -> DirError {
    DirError::Read(e.to_string())
}

fn u16_at(b: &[u8], i: usize) -> u64 {
    u16::from_le_bytes([b[i], b[i + 1]]) as u64
}

fn u32_at(b: &[u8], i: usize) -> u64 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as u64
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

fn read_at<R: Read + Seek>(r: &mut R, at: u64, buf: &mut [u8]) -> Result<(), DirError> {
    r.seek(SeekFrom::Start(at)).map_err(read_err)?;
    r.read_exact(buf).map_err(read_err)
}

/// Check the directory of the `size`-byte archive `r`, or say why not.
pub(super) fn check<R: Read + Seek>(r: &mut R, size: u64) -> Result<Directory, DirError> {
    let tail_len = size.min(TAIL);
    let tail_start = size - tail_len;
    let mut tail = vec![0u8; tail_len as usize];
    read_at(r, tail_start, &mut tail)?;
    let mut found = memchr::memmem::find_iter(&tail, EOCD);
    let at = found.next().ok_or(DirError::NoEndRecord)?;
    let more = found.count();
    if more > 0 {
        return Err(DirError::SeveralEndRecords(more + 1));
    }
    let eocd_at = tail_start + at as u64;
    if eocd_at + EOCD_LEN > size {
        return Err(DirError::NoEndRecord);
    }
    let e = &tail[at..at + EOCD_LEN as usize];
    let comment = u16_at(e, 20);
    let after = size - eocd_at - EOCD_LEN;
    if comment != after {
        return Err(DirError::CommentLength { comment, after });
    }
    let (disk, cd_disk, disk_entries) = (u16_at(e, 4), u16_at(e, 6), u16_at(e, 8));
    let (entries32, bytes32, offset32) = (u16_at(e, 10), u32_at(e, 12), u32_at(e, 16));
    if disk != 0 || cd_disk != 0 || disk_entries != entries32 {
        return Err(DirError::MultiDisk);
    }
    // The zip crate takes the zip64 path exactly when a field is saturated
    // (`may_be_zip64`); so do we.
    let zip64 = entries32 == 0xFFFF || bytes32 == 0xFFFF_FFFF || offset32 == 0xFFFF_FFFF;
    let (dir, end) = if zip64 {
        let (dir, record_at) = zip64_records(r, eocd_at, (entries32, bytes32, offset32))?;
        (dir, record_at)
    } else {
        (Directory { entries: entries32, offset: offset32, bytes: bytes32, zip64: false }, eocd_at)
    };
    if dir.entries > MAX_ENTRIES {
        return Err(DirError::TooManyEntries(dir.entries));
    }
    if dir.bytes > MAX_DIR_BYTES {
        return Err(DirError::TooLarge(dir.bytes));
    }
    // Abutting: the crate then reads from exactly this offset (archive
    // offset 0) and refuses, rather than falls back, on a bad header.
    if dir.offset.checked_add(dir.bytes) != Some(end) {
        return Err(DirError::Misplaced { offset: dir.offset, bytes: dir.bytes, end });
    }
    walk(r, &dir)?;
    Ok(dir)
}

/// The zip64 locator right before the end record, and the zip64 end record
/// right before the locator; their counts replace the saturated ones.
fn zip64_records<R: Read + Seek>(
    r: &mut R,
    eocd_at: u64,
    (entries32, bytes32, offset32): (u64, u64, u64),
) -> Result<(Directory, u64), DirError> {
    let locator_at = eocd_at
        .checked_sub(LOCATOR_LEN)
        .ok_or(DirError::Zip64("locator does not fit before the end record"))?;
    let mut l = [0u8; LOCATOR_LEN as usize];
    read_at(r, locator_at, &mut l)?;
    if &l[..4] != LOCATOR {
        return Err(DirError::Zip64("locator is missing before the end record"));
    }
    if u32_at(&l, 4) != 0 || u32_at(&l, 16) > 1 {
        return Err(DirError::MultiDisk);
    }
    let record_at = u64_at(&l, 8);
    // No extensible data: the record is exactly 56 bytes and ends at the
    // locator, so the crate's search for other records in between has
    // nothing to find.
    if record_at.checked_add(EOCD64_LEN) != Some(locator_at) {
        return Err(DirError::Zip64("end record is not right before its locator"));
    }
    let mut z = [0u8; EOCD64_LEN as usize];
    read_at(r, record_at, &mut z)?;
    if &z[..4] != EOCD64 {
        return Err(DirError::Zip64("end record is missing where its locator points"));
    }
    if u64_at(&z, 4) != EOCD64_LEN - 12 {
        return Err(DirError::Zip64("end record has extensible data"));
    }
    if u32_at(&z, 16) != 0 || u32_at(&z, 20) != 0 || u64_at(&z, 24) != u64_at(&z, 32) {
        return Err(DirError::MultiDisk);
    }
    let dir = Directory {
        entries: u64_at(&z, 32),
        bytes: u64_at(&z, 40),
        offset: u64_at(&z, 48),
        zip64: true,
    };
    // A field the zip32 record did not saturate must agree with zip64's.
    let agrees = |v32: u64, sat: u64, v64: u64| v32 == sat || v32 == v64;
    if !agrees(entries32, 0xFFFF, dir.entries)
        || !agrees(bytes32, 0xFFFF_FFFF, dir.bytes)
        || !agrees(offset32, 0xFFFF_FFFF, dir.offset)
    {
        return Err(DirError::Zip64("end record disagrees with the zip32 end record"));
    }
    Ok((dir, record_at))
}

/// Walk every central header: each where the previous one ends, the last
/// ending where the directory does.
fn walk<R: Read + Seek>(r: &mut R, dir: &Directory) -> Result<(), DirError> {
    r.seek(SeekFrom::Start(dir.offset)).map_err(read_err)?;
    let mut reader = BufReader::with_capacity(64 << 10, r.take(dir.bytes));
    let mut left = dir.bytes;
    let mut h = [0u8; HEADER_LEN as usize];
    for index in 1..=dir.entries {
        let header = |why| DirError::Header { index, entries: dir.entries, why };
        if left < HEADER_LEN {
            return Err(header("the directory ends inside it"));
        }
        reader.read_exact(&mut h).map_err(read_err)?;
        if &h[..4] != HEADER {
            return Err(header("no header signature where the previous header ends"));
        }
        if u16_at(&h, 34) != 0 {
            return Err(DirError::MultiDisk);
        }
        let rest = u16_at(&h, 28) + u16_at(&h, 30) + u16_at(&h, 32);
        left -= HEADER_LEN;
        if rest > left {
            return Err(header("its name, extra field and comment run past the directory"));
        }
        let skipped = io::copy(&mut (&mut reader).take(rest), &mut io::sink()).map_err(read_err)?;
        if skipped != rest {
            return Err(header("the file ends inside it"));
        }
        left -= rest;
    }
    if left > 0 {
        return Err(DirError::Trailing(left));
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::io::Cursor;

    /// A central header for a stored, empty entry named `name` at offset 0.
    fn header(name: &[u8]) -> Vec<u8> {
        let mut h = HEADER.to_vec();
        h.extend_from_slice(&[45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        h.extend_from_slice(&[0; 12]); // crc, sizes
        h.extend_from_slice(&(name.len() as u16).to_le_bytes());
        h.extend_from_slice(&[0; 16]); // extra, comment, disk, attributes, offset
        h.extend_from_slice(name);
        h
    }

    fn eocd(entries: u16, bytes: u32, offset: u32, comment: u16) -> Vec<u8> {
        let mut e = EOCD.to_vec();
        e.extend_from_slice(&[0, 0, 0, 0]);
        e.extend_from_slice(&entries.to_le_bytes());
        e.extend_from_slice(&entries.to_le_bytes());
        e.extend_from_slice(&bytes.to_le_bytes());
        e.extend_from_slice(&offset.to_le_bytes());
        e.extend_from_slice(&comment.to_le_bytes());
        e
    }

    /// A local header for the stored, empty entry `a`.
    pub(in crate::artifacts) fn local() -> Vec<u8> {
        let mut l = b"PK\x03\x04".to_vec();
        l.extend_from_slice(&[45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        l.extend_from_slice(&[0; 12]);
        l.extend_from_slice(&[1, 0, 0, 0, b'a']);
        l
    }

    /// Issue 15's attack: a zip64 archive of `entries` distinct names, its
    /// real end records, then a decoy zip32 end record claiming one entry
    /// with a comment length past the end of the file.
    pub(in crate::artifacts) fn zip64_with_decoy(entries: u64) -> Vec<u8> {
        let mut f = local();
        let offset = f.len() as u64;
        for i in 0..entries {
            f.extend(header(format!("{i:07}").as_bytes()));
        }
        let bytes = f.len() as u64 - offset;
        f.extend(zip64_tail(entries, bytes, offset, f.len() as u64));
        f.extend(eocd(0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF, 0));
        f.extend(eocd(1, 53, offset as u32, 0xFFFF));
        f
    }

    /// A zip64 end record at `at` and its locator.
    fn zip64_tail(entries: u64, bytes: u64, offset: u64, at: u64) -> Vec<u8> {
        let mut z = EOCD64.to_vec();
        z.extend_from_slice(&44u64.to_le_bytes());
        z.extend_from_slice(&[45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        for v in [entries, entries, bytes, offset] {
            z.extend_from_slice(&v.to_le_bytes());
        }
        z.extend_from_slice(LOCATOR);
        z.extend_from_slice(&0u32.to_le_bytes());
        z.extend_from_slice(&at.to_le_bytes());
        z.extend_from_slice(&1u32.to_le_bytes());
        z
    }

    /// A well-formed archive of `n` entries (zip64 records when asked).
    fn archive(n: u64, zip64: bool) -> Vec<u8> {
        let mut f = local();
        let offset = f.len() as u64;
        for i in 0..n {
            f.extend(header(format!("n{i}").as_bytes()));
        }
        let bytes = f.len() as u64 - offset;
        if zip64 {
            f.extend(zip64_tail(n, bytes, offset, f.len() as u64));
            f.extend(eocd(0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF, 0));
        } else {
            f.extend(eocd(n as u16, bytes as u32, offset as u32, 0));
        }
        f
    }

    fn check_bytes(f: &[u8]) -> Result<Directory, DirError> {
        check(&mut Cursor::new(f), f.len() as u64)
    }

    #[test]
    fn a_decoy_end_record_after_a_huge_zip64_directory_is_refused() {
        let f = zip64_with_decoy(MAX_ENTRIES + 10);
        assert_eq!(check_bytes(&f), Err(DirError::SeveralEndRecords(2)));
        // Alone, the decoy's comment length gives it away.
        let mut lone = local();
        lone.extend(eocd(1, 53, 31, 0xFFFF));
        assert_eq!(check_bytes(&lone), Err(DirError::CommentLength { comment: 0xFFFF, after: 0 }));
        // Without the decoy, the real record's count does.
        let real = &f[..f.len() - 22];
        assert_eq!(check_bytes(real), Err(DirError::TooManyEntries(MAX_ENTRIES + 10)));
    }

    #[test]
    fn well_formed_zip32_and_zip64_directories_within_the_caps_pass() {
        let d = check_bytes(&archive(3, false)).unwrap();
        assert_eq!((d.entries, d.offset, d.bytes, d.zip64), (3, 31, 3 * 48, false));
        let d = check_bytes(&archive(3, true)).unwrap();
        assert_eq!((d.entries, d.zip64), (3, true));
        assert_eq!(check_bytes(&archive(0, false)).unwrap().entries, 0);
        // A real comment that ends the file is fine.
        let mut f = archive(2, false);
        let n = f.len();
        f[n - 2..].copy_from_slice(&5u16.to_le_bytes());
        f.extend_from_slice(b"hello");
        assert!(check_bytes(&f).is_ok());
    }

    #[test]
    fn counts_sizes_and_offsets_that_do_not_add_up_are_refused() {
        let f = archive(3, false);
        let n = f.len();
        let with = |at: usize, bytes: &[u8]| {
            let mut g = f.clone();
            g[at..at + bytes.len()].copy_from_slice(bytes);
            check_bytes(&g)
        };
        // One header more than the directory holds.
        assert!(matches!(with(n - 12, &4u16.to_le_bytes()), Err(DirError::MultiDisk)));
        let mut g = f.clone();
        g[n - 12..n - 10].copy_from_slice(&4u16.to_le_bytes());
        g[n - 14..n - 12].copy_from_slice(&4u16.to_le_bytes());
        assert!(matches!(check_bytes(&g), Err(DirError::Header { index: 4, .. })), "{:?}", check_bytes(&g));
        // One fewer: bytes left over.
        g[n - 12..n - 10].copy_from_slice(&2u16.to_le_bytes());
        g[n - 14..n - 12].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(check_bytes(&g), Err(DirError::Trailing(48)));
        // A directory that does not end at its end record.
        assert!(matches!(with(n - 6, &0u32.to_le_bytes()), Err(DirError::Misplaced { .. })));
        assert!(matches!(with(n - 10, &(u32::MAX - 1).to_le_bytes()), Err(DirError::TooLarge(_))));
        // A name length that runs past the directory.
        assert!(matches!(with(31 + 28, &[200, 0]), Err(DirError::Header { index: 1, .. })));
        // A second end signature anywhere in the tail, even in a name.
        let mut h = archive(0, false);
        h.splice(31..31, header(b"PK\x05\x06"));
        assert!(matches!(check_bytes(&h), Err(DirError::SeveralEndRecords(2))));
        assert_eq!(check_bytes(b"PK\x03\x04 not a zip"), Err(DirError::NoEndRecord));
    }

    #[test]
    fn zip64_records_must_be_exactly_where_the_locator_says() {
        let f = archive(3, true);
        let n = f.len();
        let (locator, record) = (n - 22 - 20, n - 22 - 20 - 56);
        let with = |at: usize, bytes: &[u8]| {
            let mut g = f.clone();
            g[at..at + bytes.len()].copy_from_slice(bytes);
            check_bytes(&g)
        };
        assert!(matches!(with(locator, b"PK\x00\x00"), Err(DirError::Zip64(_))));
        assert!(matches!(with(locator + 8, &0u64.to_le_bytes()), Err(DirError::Zip64(_))));
        assert!(matches!(with(locator + 16, &2u32.to_le_bytes()), Err(DirError::MultiDisk)));
        assert!(matches!(with(record, b"PK\x00\x00"), Err(DirError::Zip64(_))));
        assert!(matches!(with(record + 4, &60u64.to_le_bytes()), Err(DirError::Zip64(_))));
        let huge = 2_000_000u64.to_le_bytes();
        let mut g = f.clone();
        g[record + 24..record + 32].copy_from_slice(&huge);
        g[record + 32..record + 40].copy_from_slice(&huge);
        assert_eq!(check_bytes(&g), Err(DirError::TooManyEntries(2_000_000)));
        // A zip32 count that disagrees with the zip64 one.
        assert!(matches!(with(n - 14, &[7, 0, 7, 0]), Err(DirError::Zip64(_))));
    }

    #[test]
    fn the_zip_crate_opens_what_passes() {
        for zip64 in [false, true] {
            let f = archive(5, zip64);
            check_bytes(&f).unwrap();
            let z = zip::ZipArchive::new(Cursor::new(&f)).unwrap();
            assert_eq!(z.len(), 5);
        }
    }
}
