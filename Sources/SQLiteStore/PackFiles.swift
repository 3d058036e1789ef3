import CLinuxSupport
import DocumentEngine
import Foundation
import Synchronization
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// The bytes of large chunks, in append-only files beside the store, so that bulk data crosses
/// the store once.
///
/// In a row, a chunk's bytes were written three times before a save's `fsync` returned: to the
/// spill file, to SQLite's log, and by the checkpoint into the database file (a third of the
/// daemon's CPU in a 1 GiB write); and a cold 4 KiB read was two or three overflow pages.
///
/// - **Where.** The folder `<store>-packs`, beside the store as SQLite's `-wal` file is: it is
///   part of the store and moves with it. `packed_chunks` names a chunk's pack and position.
/// - **Writers.** Each process appends to a pack of its own (`<16 hex digits>.pack`), only
///   inside write transactions, which SQLite's write lock already serializes. From its first
///   append in a transaction until the transaction ends it holds a shared `flock` on the pack,
///   so that garbage collection (which takes an exclusive one, never waiting) leaves bytes not
///   yet named alone. Between transactions collection may move the pack's chunks and remove it;
///   the writer then finds the file unlinked and starts another. Neither waits for the other's
///   lock, so a writer inside SQLite's write lock never waits for a collector that wants it.
///   A pack is never reopened for writing once its process lets it go.
/// - **Order.** A transaction's appended bytes are synced before it commits, durable or not: the
///   kernel may write a deferred commit's log to disk at any time, and a log that survives a
///   power cut must never name bytes that did not. A rolled-back transaction's bytes are cut off.
/// - **Small saves stay in SQLite.** A transaction's first ``inlineBudget`` bytes of new chunks
///   are rows as before, so a small save still commits with one sync (its log's).
/// - **Bulk bypasses the page cache.** A bulk transaction's chunks (``beginBulk()``) are
///   gathered in memory and written in one O_DIRECT write before it commits (``Staging``).
final class PackFiles: Sendable {
    /// Where a packed chunk's bytes are.
    struct Place: Sendable, Equatable {
        var pack: Int64
        var position: Int64
        var size: Int
    }

    /// New chunk bytes per transaction that stay rows of `chunks`: fsx's and an editor's saves,
    /// and small files, commit with one sync.
    static let inlineBudget = 256 << 10
    /// Chunks under this stay rows whatever the transaction wrote before them.
    static let smallestPacked = 16 << 10
    /// A writer starts a new pack once its pack has this many bytes, so that garbage collection
    /// can give space back a pack at a time.
    static let packLimit: Int64 = 256 << 20
    /// A pack's pages this far behind its end leave the page cache once they are on disk.
    ///
    /// A long save filled the page cache with a second copy of the file (the first is the
    /// mount's spill, which keeps serving reads), and on a virtual machine whose host takes back
    /// free memory, pages never used since are slow to fill: a 1 GiB write spent a third of its
    /// daemon's CPU copying into fresh pack pages, 15 times as long a byte as into the spill.
    /// Dropped, a pack's pages are reused by the pages that follow.
    static let dropBehind: Int64 = 8 << 20
    /// Writeback is started once this many bytes were appended since it last was: started for
    /// each chunk, its submission was a tenth of a 1 GiB save's time.
    static let writebackStep: Int64 = 1 << 20
    /// What O_DIRECT writes are aligned to: the page, which every block size divides.
    static let directAlignment = 4096
    /// The kernel's page: a chunk is placed at the same offset within a page of its pack as it
    /// starts at within a page of its file (its phase), so that a read of one page of the file
    /// reads one page of the pack. Placed back to back, two thirds of the 4 KiB random reads
    /// of a file read two pages (8 KiB) from the disk, and a cold read took 5–9 µs longer. The
    /// padding costs 2 KiB a chunk on average (1.5 % of a random file's 148 KiB average chunk).
    static let pageSize = 4096
    /// A bulk transaction's chunks are written once this many bytes are gathered (a save's
    /// batches are about 4 MiB, so one write each); a larger chunk goes through the page cache.
    static let stagingLimit = 8 << 20

    let folder: String
    private let storePath: String

    private struct Writer {
        var fd: Int32
        /// The pack opened for O_DIRECT writes; -1 where the file system refuses them.
        var direct: Int32
        var id: Int64
        /// Bytes appended.
        var end: Int64
        /// Bytes that committed transactions (or a failed rollback) left.
        var committedEnd: Int64
        /// Bytes whose pages were let go from the page cache (``dropBehind``).
        var dropped: Int64 = 0
        /// Bytes whose writeback was started (``writebackStep``).
        var started: Int64 = 0
        /// Whether this transaction holds the shared lock.
        var locked: Bool
    }
    private struct State {
        var writer: Writer?
        /// Chunk bytes the running transaction kept as rows.
        var inlineBytes = 0
        /// The running transaction stores bulk data (``beginBulk()``).
        var bulk = false
        /// Kept between transactions once made: its pages, touched again, cost no page faults.
        var staging: Staging?
    }

    /// A bulk transaction's chunks, gathered for one write that bypasses the page cache.
    ///
    /// Appended through the page cache, a 1 GiB save's chunks were copied into fresh pages and
    /// then written back by the kernel: a third of the daemon's CPU in the save, while the other
    /// threads cut and hash on the same two cores. Written from here with O_DIRECT, the disk
    /// takes the bytes without a core copying them. Positions are given as chunks arrive; no
    /// one reads them before the transaction commits, and it writes them first.
    private final class Staging {
        let bytes: UnsafeMutableRawPointer
        /// The pack position of the first byte, a multiple of ``directAlignment``.
        var start: Int64 = 0
        var count = 0

        init?() {
            var memory: UnsafeMutableRawPointer?
            guard posix_memalign(&memory, PackFiles.directAlignment, PackFiles.stagingLimit) == 0, let memory
            else { return nil }
            bytes = memory
        }

        deinit { free(bytes) }
    }
    private let state = Mutex(State())
    /// Chunks the store names in packs although their folder was missing when it was opened.
    private let lost = Mutex(0)

    /// An open pack, for reads; closed when the last read using it ends.
    private final class Handle: Sendable {
        let fd: Int32
        init(_ fd: Int32) { self.fd = fd }
        deinit { close(fd) }
    }
    /// Open packs by id and by whether reads of parts use them (see ``handle(_:parts:)``).
    private let handles = Mutex<[HandleKey: Handle]>([:])
    private struct HandleKey: Hashable {
        var pack: Int64
        var parts: Bool
    }
    static let keptHandles = 64

    init(storePath: String) {
        self.storePath = storePath
        folder = storePath + "-packs"
    }

    deinit {
        state.withLock { if let writer = $0.writer { Self.closeWriter(writer) } }
    }

    /// Chunks the store names in packs although their folder was missing when it was opened
    /// (the store was copied without it): 0 for a whole store.
    var chunksInMissingFolder: Int { lost.withLock { $0 } }

    /// Notes at open that the folder is missing though `chunks` chunks are in packs there: no
    /// save makes a new, empty folder in its place (``makeFolder()``), which would hide the loss.
    func folderMissing(chunks: Int) { lost.withLock { $0 = chunks } }

    func path(_ pack: Int64) -> String {
        folder + "/" + Self.name(pack)
    }

    static func name(_ pack: Int64) -> String {
        String(format: "%016llx.pack", UInt64(bitPattern: pack))
    }

    /// The pack id of a file name in the folder; nil for anything else.
    static func id(ofFile name: String) -> Int64? {
        guard name.hasSuffix(".pack"), name.count == 21, let value = UInt64(name.prefix(16), radix: 16),
            value > 0, value <= UInt64(Int64.max)
        else { return nil }
        return Int64(value)
    }

    // MARK: Writing (on the writer connection's thread, inside its transactions)

    /// Called before each write transaction.
    func beginTransaction() {
        state.withLock { state in
            state.inlineBytes = 0
            state.bulk = false
            state.staging?.count = 0
            if let writer = state.writer, writer.end >= Self.packLimit {
                Self.closeWriter(writer)
                state.writer = nil
            }
        }
    }

    /// The rest of this transaction stores bulk data: every chunk of at least ``smallestPacked``
    /// bytes is packed, and written with O_DIRECT where the file system allows (``Staging``).
    func beginBulk() {
        state.withLock { state in
            state.inlineBytes = Self.inlineBudget
            state.bulk = true
        }
    }

    private static func closeWriter(_ writer: Writer) {
        close(writer.fd)
        if writer.direct >= 0 { close(writer.direct) }
    }

    /// Appends `data` to this process's pack at the next position whose offset within its page
    /// is `phase` (see ``pageSize``) and says where it is; nil when the chunk stays a row (small,
    /// or within the transaction's inline budget). `force` packs it regardless.
    func place(_ data: Data, force: Bool = false, phase: Int = 0) throws -> Place? {
        // The lock is held across the write: only the writer, which SQLite's write lock already
        // makes one at a time, and collection letting a pack go use it; no read does.
        try state.withLock { state -> Place? in
            if !force {
                if data.count < Self.smallestPacked || state.inlineBytes + data.count <= Self.inlineBudget {
                    state.inlineBytes += data.count
                    return nil
                }
            }
            if let held = state.writer, !held.locked, !Self.stillOurs(held.fd) {
                Self.closeWriter(held)
                state.writer = nil
            }
            var writer = try state.writer ?? createPack()
            writer.locked = true
            state.writer = writer
            if state.bulk, data.count <= Self.stagingLimit {
                if state.staging == nil { state.staging = Staging() }
                if let staging = state.staging {
                    if staging.count + Self.padding(before: staging.count, phase: phase) + data.count
                        > Self.stagingLimit
                    {
                        try flushStaged(staging, &writer)
                    }
                    if staging.count == 0 {
                        let align = Int64(Self.directAlignment)
                        staging.start = (writer.end + align - 1) / align * align
                    }
                    // The start is page-aligned, so the phase within the staging is the pack's.
                    let padding = Self.padding(before: staging.count, phase: phase)
                    (staging.bytes + staging.count).initializeMemory(
                        as: UInt8.self, repeating: 0, count: padding)
                    staging.count += padding
                    let position = staging.start + Int64(staging.count)
                    data.withUnsafeBytes { raw in
                        guard let from = raw.baseAddress else { return }
                        (staging.bytes + staging.count).copyMemory(from: from, byteCount: raw.count)
                    }
                    staging.count += data.count
                    writer.end = position + Int64(data.count)
                    state.writer = writer
                    return Place(pack: writer.id, position: position, size: data.count)
                }
            }
            if let staging = state.staging, staging.count > 0 {
                // Too large to gather (or no memory to): what is gathered goes first, so that
                // this chunk follows it rather than under its padding.
                try flushStaged(staging, &writer)
                state.writer = writer
            }
            // The padding is left a hole.
            let position =
                writer.end + Int64(Self.padding(before: Int(writer.end % Int64(Self.pageSize)), phase: phase))
            let code = data.withUnsafeBytes { FileIO.write(writer.fd, $0, at: position) }
            if code != 0 { throw failure(code, path: path(writer.id), doing: "write the pack of") }
            // Starts the disk write now, without waiting for it: the commit's sync then finds it
            // done or under way, so the disk works while the save cuts and hashes what follows
            // (a 1 GiB save waited 1.5 s in those syncs).
            writer.end = position + Int64(data.count)
            if writer.end - writer.started >= Self.writebackStep {
                _ = docfs_start_writeback(
                    writer.fd, off_t(writer.started), off_t(writer.end - writer.started))
                writer.started = writer.end
            }
            if writer.end - writer.dropped >= 2 * Self.dropBehind {
                // Their writeback started a few megabytes of cutting and hashing ago: the wait
                // is for the disk's last few milliseconds at most. A failure here costs memory
                // only; the commit's sync reports a failed write.
                let upTo = writer.end - Self.dropBehind
                _ = docfs_drop_written(writer.fd, off_t(writer.dropped), off_t(upTo - writer.dropped))
                writer.dropped = upTo
            }
            state.writer = writer
            return Place(pack: writer.id, position: position, size: data.count)
        }
    }

    /// The bytes to skip from `offset` (counted from a page boundary) to the next offset whose
    /// place within its page is `phase`.
    static func padding(before offset: Int, phase: Int) -> Int {
        let page = pageSize
        return ((phase % page) - offset % page + page) % page
    }

    /// Writes the staged chunks (``Staging``) at their positions, padded to a whole number of
    /// pages: with O_DIRECT, or through the page cache where the file system refuses it.
    private func flushStaged(_ staging: Staging, _ writer: inout Writer) throws {
        guard staging.count > 0 else { return }
        let align = Self.directAlignment
        let padded = (staging.count + align - 1) / align * align
        (staging.bytes + staging.count).initializeMemory(
            as: UInt8.self, repeating: 0, count: padded - staging.count)
        var code: Int32 = EINVAL
        if writer.direct >= 0 {
            code = FileIO.write(
                writer.direct, UnsafeRawBufferPointer(start: staging.bytes, count: padded), at: staging.start)
            if code == 0 {
                writer.end = staging.start + Int64(padded)
                // Nothing of it is in the page cache to write back or drop.
                writer.started = writer.end
            }
        }
        if code == ENOSPC || code == EDQUOT {
            throw failure(code, path: path(writer.id), doing: "write the pack of")
        }
        if code != 0 {
            // O_DIRECT refused (or an alignment this file system wants otherwise): the same
            // bytes at the same positions, through the page cache.
            let buffered = FileIO.write(
                writer.fd, UnsafeRawBufferPointer(start: staging.bytes, count: staging.count),
                at: staging.start)
            if buffered != 0 { throw failure(buffered, path: path(writer.id), doing: "write the pack of") }
            writer.end = staging.start + Int64(staging.count)
            if code == EINVAL, writer.direct >= 0 {
                // Opened, but its writes refused: the next ones go through the page cache at
                // once. Closed only now, since a caller that catches a failure keeps its writer.
                close(writer.direct)
                writer.direct = -1
            }
        }
        staging.count = 0
    }

    /// Syncs what the transaction appended; called just before it commits.
    func prepareCommit() throws {
        let pending = try state.withLock { state -> (fd: Int32, id: Int64)? in
            if let staging = state.staging, staging.count > 0, var writer = state.writer {
                try flushStaged(staging, &writer)
                state.writer = writer
            }
            guard let writer = state.writer, writer.end > writer.committedEnd else { return nil }
            return (writer.fd, writer.id)
        }
        guard let pending else { return }
        while fdatasync(pending.fd) != 0 {
            if errno != EINTR {
                throw failure(errno, path: path(pending.id), doing: "sync the pack of")
            }
        }
    }

    /// The transaction committed: its bytes are named.
    func committed() {
        state.withLock { state in
            if var writer = state.writer {
                writer.committedEnd = writer.end
                Self.unlock(&writer)
                state.writer = writer
            }
        }
    }

    private static func unlock(_ writer: inout Writer) {
        if writer.locked {
            _ = lock(writer.fd, LOCK_UN)
            writer.locked = false
        }
    }

    /// Takes the shared lock on a pack written in an earlier transaction, if collection does
    /// not hold it and has not removed the pack.
    private static func stillOurs(_ fd: Int32) -> Bool {
        guard lock(fd, LOCK_SH | LOCK_NB) else { return false }
        var st = stat()
        return fstat(fd, &st) == 0 && st.st_nlink > 0
    }

    /// Stops appending to `pack` (collection is about to move its chunks).
    func letGo(_ pack: Int64) {
        state.withLock { state in
            guard let writer = state.writer, writer.id == pack else { return }
            Self.closeWriter(writer)
            state.writer = nil
        }
    }

    /// The transaction rolled back: its bytes are cut off (or, if that fails, the pack is let go
    /// and they wait for garbage collection).
    func rolledBack() {
        state.withLock { state in
            state.staging?.count = 0
            guard var writer = state.writer else { return }
            if writer.end > writer.committedEnd {
                guard ftruncate(writer.fd, off_t(writer.committedEnd)) == 0 else {
                    Self.closeWriter(writer)
                    state.writer = nil
                    return
                }
                writer.end = writer.committedEnd
                writer.dropped = min(writer.dropped, writer.end)
                writer.started = min(writer.started, writer.end)
            }
            Self.unlock(&writer)
            state.writer = writer
        }
    }

    private func createPack() throws -> Writer {
        try makeFolder()
        for _ in 0..<16 {
            let id = Int64.random(in: 1...Int64.max)
            let fd = open(path(id), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            if fd < 0 {
                if errno == EEXIST { continue }
                throw failure(errno, path: folder, doing: "create a pack in")
            }
            // Locked first, then checked still linked: garbage collection in another process
            // may have taken the new, empty file for garbage between its creation and the lock.
            guard Self.stillOurs(fd) else {
                close(fd)
                continue
            }
            try SQLiteBackend.syncFolder(folder, path: folder, doing: "sync")
            return Writer(
                fd: fd, direct: docfs_open_direct_writes(path(id)), id: id, end: 0, committedEnd: 0,
                locked: true)
        }
        throw DocumentStoreError.io("cannot create a pack in \(folder)")
    }

    private func makeFolder() throws {
        var existing = stat()
        if let lost = missingFolderError, stat(folder, &existing) != 0, errno == ENOENT { throw lost }
        if mkdir(folder, 0o700) == 0 {
            // The folder's own entry must survive a power cut with the first pack's bytes.
            let parent = (storePath as NSString).deletingLastPathComponent
            try SQLiteBackend.syncFolder(parent, path: parent.isEmpty ? "." : parent, doing: "sync")
            return
        }
        guard errno == EEXIST else { throw SQLiteBackend.systemError(errno, path: folder, doing: "create") }
        var st = stat()
        guard stat(folder, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else {
            throw DocumentStoreError.io("the store's pack folder \(folder) is not a folder")
        }
    }

    /// `flock`, retried when interrupted; false when it fails (or would block, with LOCK_NB).
    static func lock(_ fd: Int32, _ operation: Int32) -> Bool {
        while flock(fd, operation) != 0 {
            if errno != EINTR { return false }
        }
        return true
    }

    // MARK: Reading

    /// The pack's file is gone: garbage collection moved its chunks since the caller's snapshot
    /// read their place (or the store is damaged).
    struct Missing: Error {
        let pack: Int64
    }

    /// Bytes `range` (nil: all) of the chunk at `place`.
    func read(_ place: Place, _ range: Range<Int>? = nil) throws -> Data {
        var data = Data(count: (range ?? 0..<max(0, place.size)).count)
        try data.withUnsafeMutableBytes { buffer in try read(place, range, into: buffer) }
        return data
    }

    /// Bytes `range` (nil: all) of the chunk at `place` into `buffer`, which is as long.
    func read(_ place: Place, _ range: Range<Int>?, into buffer: UnsafeMutableRawBufferPointer) throws {
        let wanted = range ?? 0..<max(0, place.size)
        guard place.pack > 0, place.position >= 0, place.size >= 0,
            place.size <= VersionedStore.maximumChunkSize, wanted.lowerBound >= 0,
            wanted.upperBound <= place.size, buffer.count == wanted.count
        else {
            throw DocumentStoreError.corrupt(
                path: storePath,
                reason: "a chunk's place in pack \(Self.name(place.pack)) is impossible "
                    + "(\(place.position), \(place.size) bytes)")
        }
        let handle = try self.handle(place.pack, parts: wanted.count < place.size)
        let start = place.position + Int64(wanted.lowerBound)
        let done: Int
        switch FileIO.read(handle.fd, buffer, at: start) {
        case .success(let count): done = count
        case .failure(let error):
            throw SQLiteBackend.systemError(error.code, path: path(place.pack), doing: "read the pack of")
        }
        guard done == wanted.count else {
            throw DocumentStoreError.corrupt(
                path: storePath, reason: "pack \(Self.name(place.pack)) ends before the chunk's bytes")
        }
    }

    /// An open pack. Reads of parts of chunks (a random 4 KiB read) use a descriptor of their own
    /// marked random: with the kernel's readahead each read of 4 KiB fetched many more from
    /// the disk (a fifth of a cold random read's CPU went to readahead, and its IOPS did not
    /// rise over SQLite's). Whole chunks keep readahead, which reads them ahead of the caller.
    private func handle(_ pack: Int64, parts: Bool) throws -> Handle {
        let key = HandleKey(pack: pack, parts: parts)
        if let handle = handles.withLock({ $0[key] }) { return handle }
        let fd = open(path(pack), O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { throw Missing(pack: pack) }
            throw SQLiteBackend.systemError(errno, path: path(pack), doing: "open the pack of")
        }
        if parts { _ = posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM) }
        let handle = Handle(fd)
        handles.withLock { handles in
            if handles.count >= Self.keptHandles, let any = handles.keys.first { handles[any] = nil }
            handles[key] = handle
        }
        return handle
    }

    /// Chunk `id`'s bytes `range` (nil: all) at `place`. When the pack is gone, the chunk's place
    /// is looked up again outside the caller's snapshot: garbage collection moved it, and a
    /// chunk's bytes are the same wherever they are.
    func readChunk(_ id: Int64, at place: Place, _ range: Range<Int>? = nil) throws -> Data {
        let wanted = range ?? 0..<max(0, place.size)
        var data = Data(count: wanted.count)
        try data.withUnsafeMutableBytes { buffer in try readChunk(id, at: place, wanted, into: buffer) }
        return data
    }

    /// ``readChunk(_:at:_:)`` into `buffer`, which is as long as the range: a random read's
    /// slice goes from the pack to the reply without a copy of its own.
    func readChunk(
        _ id: Int64, at place: Place, _ range: Range<Int>, into buffer: UnsafeMutableRawBufferPointer
    )
        throws
    {
        do { try read(place, range, into: buffer) } catch let missing as Missing {
            guard let moved = try locate(id), moved.pack != place.pack else {
                throw missingError(missing.pack)
            }
            cache(moved, of: id)
            do { try read(moved, range, into: buffer) } catch let again as Missing {
                throw missingError(again.pack)
            }
        }
    }

    /// Chunks' places as committed rows gave them (nil: not packed), for reads of parts: the
    /// statement was a seventh of a cold random read's CPU. A place stays true: chunk ids are
    /// never reused, a chunk is packed or not for life, and collection moves a chunk without
    /// touching the bytes at its old place, which a read finds through a descriptor still open
    /// or, once the pack is gone, by ``readChunk(_:at:_:)`` looking it up again.
    private let places = Mutex<[Int64: Place?]>([:])
    static let keptPlaces = 65_536

    /// The cached place of chunk `id`: nil when none is cached, `.some(nil)` when it is not packed.
    func cachedPlace(_ id: Int64) -> Place?? { places.withLock { $0[id] } }

    func cache(_ place: Place?, of id: Int64) {
        places.withLock { places in
            if places.count >= Self.keptPlaces { places.removeAll(keepingCapacity: true) }
            places[id] = .some(place)
        }
    }

    /// Caches the places of the packed chunks `found`.
    func cache(_ found: [(id: Int64, place: Place)]) {
        places.withLock { places in
            if places.count + found.count >= Self.keptPlaces { places.removeAll(keepingCapacity: true) }
            for (id, place) in found { places[id] = .some(place) }
        }
    }

    /// A connection of its own for ``locate(_:)``, outside any snapshot; rarely used.
    private let locator = Mutex<PlainReadConnection?>(nil)

    /// Where chunk `id`'s bytes are now, from the store's latest commit.
    func locate(_ id: Int64) throws -> Place? {
        try locator.withLock { locator in
            if locator == nil {
                locator = PlainReadConnection(path: storePath)
            }
            guard let locator else { throw DocumentStoreError.io("cannot open the store \(storePath) again") }
            return try locator.place(id)
        }
    }

    /// Forgets the open file of a pack that garbage collection removed.
    func forget(_ pack: Int64) {
        handles.withLock { handles in
            handles[HandleKey(pack: pack, parts: false)] = nil
            handles[HandleKey(pack: pack, parts: true)] = nil
        }
    }

    /// The packs in the folder and their sizes.
    func files() -> [(id: Int64, size: Int64)] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder) else { return [] }
        return names.compactMap { name -> (Int64, Int64)? in
            guard let id = Self.id(ofFile: name) else { return nil }
            var st = stat()
            guard stat(folder + "/" + name, &st) == 0 else { return nil }
            return (id, Int64(st.st_size))
        }
    }

    /// A failed write to the packs: a full disk names the store, as SQLite's own writes do (the
    /// user knows the store, not its packs), and anything else the file.
    private func failure(_ code: Int32, path: String, doing what: String) -> DocumentStoreError {
        if code == ENOSPC || code == EDQUOT { return .noSpace(storePath) }
        return SQLiteBackend.systemError(code, path: path, doing: what)
    }

    /// Why the store is damaged, and what to do, when its folder was missing at open
    /// (``folderMissing(chunks:)``); nil otherwise.
    var missingFolderError: DocumentStoreError? {
        let chunks = chunksInMissingFolder
        guard chunks > 0 else { return nil }
        let counted = chunks == 1 ? "1 chunk is" : "\(chunks) chunks are"
        return .corrupt(
            path: storePath,
            reason: "its pack folder \(folder) is missing, though \(counted) "
                + "in packs there (the folder belongs to the store and moves with it); put it back beside "
                + "the store, or make an empty folder there to go on without those chunks (the files "
                + "that use them then fail to read)")
    }

    /// The missing-pack message, for reads that cannot find a chunk's pack again.
    func missingError(_ pack: Int64) -> DocumentStoreError {
        .corrupt(
            path: storePath,
            reason:
                "its pack file \(path(pack)) is missing (the folder \(folder) belongs to the store and moves with it)"
        )
    }
}
