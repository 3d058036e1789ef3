import CLinuxSupport
import DocumentEngine
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Changes made durable before they are saved (``FileSystemStore/logIntent(_:)``), as a file
/// system's intent log (ZFS's ZIL) makes a synchronous write durable before its transaction
/// group commits.
///
/// - **Why.** An `fsync` through the mount was a durable save: cutting, hashing, rows, a commit
///   and its syncs, 1.5 ms for fsx's small edits where a passthrough file system takes 0.3 ms,
///   and for a file written at random all over, a save of every chunk of it. A record of the
///   written bytes and one sync make them as durable; the save follows in the background
///   (group commit), and its durable commit retires the record.
/// - **Where.** `<store>-intents/<16 hex digits>.log`, one per store instance that logged
///   something, under an exclusive `flock` while it lives. Opening a store replays, then
///   removes, every log no live process holds (``replayLogs(of:)``).
/// - **Records** start on 4 KiB boundaries: a header (magic, epoch, sequence, kind, payload
///   length, payload CRC-32C, header CRC-32C), written after its payload, then the payload.
///   Appends run side by side, each at its own offset and synced before it is acknowledged, so
///   a torn record may lie before a whole one: a replay skips what does not check out and looks
///   at every boundary after it.
/// - **Epochs.** Once every record is retired the log starts again at offset 0 with the next
///   epoch, rewriting its blocks in place (a sync of them then writes no metadata). Records of
///   older epochs are ignored: each was retired by a durable commit.
/// - **Retirements** are records too, written without a sync. A kill leaves them in the page
///   cache; a power cut may lose one, and the replay then finds the changes already in the
///   store (compared byte for byte) and skips them, or at worst keeps them as a conflict version.
///   Nothing is lost either way.
package final class IntentLog: Sendable {
    /// Records above this size are not logged: the save writes them once.
    package static let largestRecord = 128 << 20
    /// Records up to this size are always logged, whatever the save would write.
    package static let alwaysLogged = 1 << 20
    package static let alignment = 4096
    package static let headerSize = 40
    package static let magic: UInt64 = 0x314C_4953_4653_4344  // "DCFSSIL1" little-endian

    package enum Kind: UInt32 {
        case changes = 1
        case retired = 2
    }

    package let folder: String
    private let storePath: String

    private struct State {
        var fd: Int32 = -1
        var name = ""
        var epoch: UInt64 = 1
        var end: Int64 = 0
        var nextSequence: UInt64 = 1
        /// Changes records of this epoch not yet retired, and the appends under way.
        var live: Set<UInt64> = []
        var inFlight = 0
        var failed = false
    }
    private let state = Mutex(State())

    package init(storePath: String) {
        self.storePath = storePath
        folder = storePath + "-intents"
    }

    deinit { close() }

    /// Lets the log go: removes it when everything it holds was saved (nothing to replay), and
    /// keeps it for the next opening otherwise. A later append starts a new log.
    package func close() {
        state.withLock { state in
            guard state.fd >= 0, state.inFlight == 0 else { return }
            if state.live.isEmpty && !state.failed { unlink(folder + "/" + state.name) }
            Glibc.close(state.fd)
            state = State()
        }
    }

    // MARK: Appending

    /// Appends a record of `payload` and syncs it; returns the record's intent.
    package func append(_ payload: IntentPayload) throws -> IntentID {
        let length = payload.length
        let (fd, epoch, sequence, offset) = try state.withLock {
            state throws -> (Int32, UInt64, UInt64, Int64) in
            if state.fd < 0 { try open(&state) }
            let sequence = state.nextSequence
            state.nextSequence += 1
            let offset = state.end
            state.end += Self.aligned(Int64(Self.headerSize + length))
            state.live.insert(sequence)
            state.inFlight += 1
            return (state.fd, state.epoch, sequence, offset)
        }
        var written = false
        defer {
            state.withLock { state in
                state.inFlight -= 1
                if !written { state.live.remove(sequence) }
            }
        }
        let crc = try payload.write(fd, at: offset + Int64(Self.headerSize), path: storePath)
        try writeAll(
            fd, Self.header(epoch: epoch, sequence: sequence, kind: .changes, length: length, crc: crc),
            at: offset)
        while fdatasync(fd) != 0 {
            if errno != EINTR {
                state.withLock { $0.failed = true }
                throw StoreFiles.systemError(errno, path: storePath, doing: "sync the intent log of")
            }
        }
        written = true
        return IntentID(rawValue: sequence)
    }

    /// Forgets `intents`: their changes are committed. Starts a new epoch once nothing is live.
    package func retire(_ intents: [IntentID]) {
        guard !intents.isEmpty else { return }
        let mark = state.withLock { state -> (fd: Int32, offset: Int64, epoch: UInt64, sequence: UInt64)? in
            guard state.fd >= 0 else { return nil }
            for id in intents { state.live.remove(id.rawValue) }
            let sequence = state.nextSequence
            state.nextSequence += 1
            let offset = state.end
            state.end += Self.aligned(Int64(Self.headerSize + 8 * intents.count))
            state.inFlight += 1
            return (state.fd, offset, state.epoch, sequence)
        }
        guard let mark else { return }
        var payload = Data(capacity: 8 * intents.count)
        for id in intents { payload.append(littleEndian: id.rawValue) }
        let crc = payload.withUnsafeBytes { docfs_crc32c(0, $0.baseAddress, $0.count) }
        // No sync: see the type's comment. A failed write only costs a replay that finds the
        // changes already saved.
        _ = try? writeAll(mark.fd, payload, at: mark.offset + Int64(Self.headerSize))
        _ = try? writeAll(
            mark.fd,
            Self.header(
                epoch: mark.epoch, sequence: mark.sequence, kind: .retired, length: payload.count, crc: crc),
            at: mark.offset)
        state.withLock { state in
            state.inFlight -= 1
            if state.live.isEmpty && state.inFlight == 0 && !state.failed {
                // Every record of this epoch was committed durably, and nothing is being written:
                // the next record starts over at 0, and its higher epoch makes a replay ignore
                // what is left of these.
                state.epoch += 1
                state.end = 0
            }
        }
    }

    private func open(_ state: inout State) throws {
        if mkdir(folder, 0o700) != 0 && errno != EEXIST {
            throw StoreFiles.systemError(errno, path: storePath, doing: "make the intent log folder of")
        }
        let stem = folder + "/" + String(format: "%016llx", UInt64.random(in: 1...UInt64.max))
        let fd = Glibc.open(stem + ".new", O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw StoreFiles.systemError(errno, path: storePath, doing: "create the intent log of")
        }
        // Locked before it takes a name a replay looks at (`.log`): a replay that opened it
        // between its creation and its lock would take it for a dead process's, and remove it.
        guard flock(fd, LOCK_EX | LOCK_NB) == 0, rename(stem + ".new", stem + ".log") == 0 else {
            let code = errno
            Glibc.close(fd)
            unlink(stem + ".new")
            throw StoreFiles.systemError(code, path: storePath, doing: "create the intent log of")
        }
        // The name must survive a power cut with the first record it holds.
        do { try StoreFiles.syncFolder(folder, path: storePath, doing: "create the intent log of") } catch {
            Glibc.close(fd)
            unlink(stem + ".log")
            throw error
        }
        let name = (stem as NSString).lastPathComponent + ".log"
        state.fd = fd
        state.name = name
    }

    private func writeAll(_ fd: Int32, _ data: Data, at offset: Int64) throws {
        try data.withUnsafeBytes { raw in try Self.writeAll(fd, raw, at: offset, path: storePath) }
    }

    package static func writeAll(_ fd: Int32, _ raw: UnsafeRawBufferPointer, at offset: Int64, path: String)
        throws
    {
        let code = FileIO.write(fd, raw, at: offset)
        if code != 0 { throw StoreFiles.systemError(code, path: path, doing: "write the intent log of") }
    }

    package static func aligned(_ value: Int64) -> Int64 {
        (value + Int64(alignment) - 1) / Int64(alignment) * Int64(alignment)
    }

    /// A whole record: its header, then `payload` (for tests that make logs by hand).
    package static func record(epoch: UInt64, sequence: UInt64, kind: Kind, payload: Data) -> Data {
        let crc = payload.withUnsafeBytes { docfs_crc32c(0, $0.baseAddress, $0.count) }
        return header(epoch: epoch, sequence: sequence, kind: kind, length: payload.count, crc: crc) + payload
    }

    package static func header(epoch: UInt64, sequence: UInt64, kind: Kind, length: Int, crc: UInt32) -> Data
    {
        var header = Data(capacity: headerSize)
        header.append(littleEndian: magic)
        header.append(littleEndian: epoch)
        header.append(littleEndian: sequence)
        header.append(littleEndian: kind.rawValue)
        header.append(littleEndian: UInt32(length))
        header.append(littleEndian: crc)
        let check = header.withUnsafeBytes { docfs_crc32c(0, $0.baseAddress, $0.count) }
        header.append(littleEndian: check)
        return header
    }

    // MARK: Reading

    /// A record that checked out.
    package struct Record {
        package var epoch: UInt64
        package var sequence: UInt64
        package var kind: Kind
        package var payload: Data
    }

    /// Every whole record of the log at `path`, in file order.
    package static func records(in fd: Int32) -> [Record] {
        var st = stat()
        guard fstat(fd, &st) == 0 else { return [] }
        let size = Int64(st.st_size)
        var records: [Record] = []
        var offset: Int64 = 0
        while offset + Int64(headerSize) <= size {
            if let record = record(in: fd, at: offset, fileSize: size) {
                records.append(record)
                offset += aligned(Int64(headerSize + record.payload.count))
            } else {
                offset += Int64(alignment)
            }
        }
        return records
    }

    private static func record(in fd: Int32, at offset: Int64, fileSize: Int64) -> Record? {
        guard let header = read(fd, count: headerSize, at: offset) else { return nil }
        var reader = ByteReader(header)
        guard let magic = reader.u64(), magic == Self.magic, let epoch = reader.u64(),
            let sequence = reader.u64(), let rawKind = reader.u32(), let kind = Kind(rawValue: rawKind),
            let length = reader.u32(), let crc = reader.u32(), let check = reader.u32()
        else { return nil }
        let computed = header.prefix(headerSize - 4).withUnsafeBytes {
            docfs_crc32c(0, $0.baseAddress, $0.count)
        }
        guard computed == check, offset + Int64(headerSize) + Int64(length) <= fileSize,
            let payload = read(fd, count: Int(length), at: offset + Int64(headerSize)),
            payload.withUnsafeBytes({ docfs_crc32c(0, $0.baseAddress, $0.count) }) == crc
        else { return nil }
        return Record(epoch: epoch, sequence: sequence, kind: kind, payload: payload)
    }

    private static func read(_ fd: Int32, count: Int, at offset: Int64) -> Data? {
        var data = Data(count: count)
        let read = data.withUnsafeMutableBytes { FileIO.read(fd, $0, at: offset) }
        return (try? read.get()) == count ? data : nil
    }
}
