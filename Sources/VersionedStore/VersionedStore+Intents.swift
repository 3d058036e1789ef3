import DocumentEngine
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The intent log's part of the store algorithm (``IntentLog``): what is logged, and how a log a
/// process left is saved. A store whose files are local keeps one beside them (SQLite); a store
/// on a server has none: its durable commit is the server's, and a log on one client's disk
/// would make an acknowledged write depend on that client coming back (see the design notes).
extension VersionedStore {
    /// Logs `changes` in `log` unless saving them at once writes no more than logging them: a
    /// record of up to 1 MiB always, a larger one (up to 128 MiB) when the save would write at
    /// least twice its bytes (a file written at random all over: its every chunk).
    /// `makeBaseDurable` runs first, when the record will be written.
    package func logIntent(
        _ changes: DocumentChanges, in log: IntentLog, makeBaseDurable: () throws -> Void
    ) throws -> IntentID? {
        let payload = try IntentPayload(changes, chunkSize: chunkSize)
        guard payload.length <= IntentLog.largestRecord,
            payload.length <= IntentLog.alwaysLogged || payload.byteCount * 2 <= payload.saveCost
        else { return nil }
        try makeBaseDurable()
        return try log.append(payload)
    }

    /// Replays the logs in `folder` that no live process holds, then removes them; returns the
    /// logs it could not save (and why), which stay for the next opening.
    package func replayIntentLogs(in folder: String) -> [String] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder) else { return [] }
        var failed: [String] = []
        for name in names.sorted() where name.hasSuffix(".log") {
            let path = folder + "/" + name
            let fd = open(path, O_RDWR | O_CLOEXEC)
            guard fd >= 0 else { continue }
            defer { close(fd) }
            // Held: its process is alive and saves what it logged.
            guard flock(fd, LOCK_EX | LOCK_NB) == 0 else { continue }
            do {
                try replay(IntentLog.records(in: fd), folder: folder)
            } catch {
                // A full disk, a failing one: the log stays for the next opening, and this one
                // goes on (a store that cannot open cannot be given its space back).
                failed.append("\(path): \(error)")
                continue
            }
            unlink(path)
        }
        return failed
    }

    /// Saves the changes of `records` (one log's) that no retirement names, oldest first.
    package func replay(_ records: [IntentLog.Record], folder: String) throws {
        guard let epoch = records.map(\.epoch).max() else { return }
        let current = records.filter { $0.epoch == epoch }
        var retired = Set<UInt64>()
        for record in current where record.kind == .retired {
            var reader = ByteReader(record.payload)
            while let sequence = reader.u64() { retired.insert(sequence) }
        }
        var pending: [(sequence: UInt64, changes: DocumentChanges)] = []
        for record in current where record.kind == .changes && !retired.contains(record.sequence) {
            // Its checksums held: a record that does not decode was written by a newer DocFS.
            guard let changes = try? IntentPayload.changes(from: record.payload) else {
                throw DocumentStoreError.newerFormat(path: folder, found: 0, supported: 1)
            }
            pending.append((record.sequence, changes))
        }
        pending.sort { $0.sequence < $1.sequence }
        // A later record of a document on the same base holds everything an earlier one does:
        // the mount logs all it has not saved each time.
        var last: [DocumentID: (sequence: UInt64, base: VersionID)] = [:]
        for item in pending { last[item.changes.document] = (item.sequence, item.changes.base) }
        for item in pending {
            if let later = last[item.changes.document], later.sequence != item.sequence,
                later.base == item.changes.base
            {
                continue
            }
            try replay(item.changes)
        }
    }

    private func replay(_ logged: DocumentChanges) throws {
        let info: DocumentInfo
        do { info = try document(logged.document) } catch DocumentStoreError.noSuchDocument {
            return
        }
        // Deleted since: as a save of a deleted document, dropped.
        guard info.deleted == nil else { return }
        if info.currentVersion != logged.base, try alreadySaved(logged) { return }
        var changes = logged
        changes.durable = true
        do { _ = try save(changes) } catch let error as DocumentStoreError {
            switch error {
            case .noSuchDocument, .noSuchNode, .noSuchVersion, .invalidName, .notARegularFile, .invalidChange,
                .conflict, .documentExists:
                // What a save of these changes by their process would have been told: the store
                // moved on in a way they cannot be applied to.
                return
            default:
                throw error
            }
        }
    }

    /// Whether the current version already holds everything `changes` would write: its save
    /// committed before the process stopped, and its retirement did not reach the disk.
    private func alreadySaved(_ changes: DocumentChanges) throws -> Bool {
        for logged in changes.nodes {
            guard var current = try node(logged.id, at: nil) else { return false }
            current.version = logged.version
            guard current == logged else { return false }
        }
        for id in changes.removedNodes where try node(id, at: nil) != nil { return false }
        func same(_ id: StoreNodeID, _ range: Range<Int64>, _ source: any ContentsSource) throws -> Bool {
            var start = range.lowerBound
            while start < range.upperBound {
                let count = Int(min(1 << 20, range.upperBound - start))
                let stored = try readContents(of: id, at: nil, offset: start, count: count)
                guard stored == (try source.read(offset: start, count: count)) else { return false }
                start += Int64(count)
            }
            return true
        }
        for (id, update) in changes.contents {
            guard let current = try node(id, at: nil), current.kind == .regularFile else { return false }
            switch update {
            case .sparse(let size, _, let source), .derived(_, let size, _, let source):
                guard current.size == size else { return false }
                for range in source.heldRanges ?? [] where try !same(id, range, source) { return false }
            case .replace(let source):
                guard current.size == source.count, try same(id, 0..<source.count, source) else {
                    return false
                }
            case .chunks(let size, let chunks):
                guard current.size == size else { return false }
                for (index, data) in chunks {
                    let start = Int64(index) * Int64(chunkSize)
                    guard start < size else { continue }
                    let range = start..<min(size, start + Int64(data.count))
                    if try !same(id, range, DataContentsSource(data.prefix(Int(range.count)))) {
                        return false
                    }
                }
            case .copy:
                // The copy's bytes are another file's: not worth comparing for a rare case.
                return false
            }
        }
        return true
    }
}
