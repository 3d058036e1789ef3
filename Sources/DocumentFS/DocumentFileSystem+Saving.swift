import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import VersionedStore

/// Saving documents, and following other processes' saves.
extension DocumentFileSystem {
    /// What one save sends, taken under the lock.
    private struct PreparedSave {
        var changes: DocumentChanges
        var records: [StoreNodeID: NodeRecord]
        var snapshots:
            [(node: ViewNode, id: StoreNodeID, snapshot: FileContents.Snapshot, text: PropertyListText?)]
        /// The nodes it looked at, to look at again if it fails.
        var touched: [ObjectIdentifier: ViewNode]
        /// The logged intents it commits.
        var intents: [IntentID]
    }

    /// What a save sends of one regular file's contents (``contentChange(_:_:stored:)``).
    struct ContentChange {
        /// Nil: the stored bytes stay.
        var update: ContentUpdate?
        /// The layers frozen for the update, and the property list text they compile to.
        var snapshot: FileContents.Snapshot?
        var text: PropertyListText?
        /// Text that does not compile (yet): the file waits.
        var held = false
    }

    /// `fsync` and `fsyncdir`: the document's changes are durable when this returns, and so is
    /// every save the store committed before. Through the store's intent log when it keeps one:
    /// one small sync, where a durable save cuts, hashes and stores every chunk the changes
    /// touch and syncs the store's log and packs; the committer saves them soon after.
    func synchronize(_ document: DocumentState?) throws(Errno) {
        // The document's name as this mount last committed it (a create, a rename at the root)
        // becomes durable with its contents, as ext4 makes a file's new name durable with it.
        let names = document.map { document in state.withLock { _ in document.namesUnsynced } } ?? false
        if let document, try save(document, durable: true, logging: true), !names { return }
        // Earlier saves may have been committed without waiting for the disk.
        try storeCall { try store.synchronize() }
        if let document, names { state.withLock { _ in document.namesUnsynced = false } }
    }

    /// Saves the document's changes as one store version. Returns when the save is committed
    /// (and, when `durable`, on disk); throws the errno a `close` or `fsync` should return.
    /// With `logging`, the store may log the changes instead (``FileSystemStore/logIntent(_:)``),
    /// and the committer saves them: returns whether it did. With `alongWith`, the save and what
    /// it does are one store transaction, which commits both or neither (a system call that
    /// changes the document and something else, a Trash record say); it runs even when there is
    /// nothing to save.
    @discardableResult
    func save(
        _ document: DocumentState, durable: Bool, logging: Bool = false, wholeFiles: Bool = false,
        alongWith other: ((any DocumentStoreTransaction) throws -> Void)? = nil
    ) throws(Errno) -> Bool {
        try ensureLoaded(document)
        compileTexts(of: document)
        document.saving.lock()
        defer { document.saving.unlock() }
        return try saveLocked(
            document, durable: durable, logging: logging && other == nil, wholeFiles: wholeFiles,
            alongWith: other)
    }

    /// ``save(_:durable:logging:alongWith:)`` for a caller that holds `document.saving` and has
    /// loaded the document.
    @discardableResult
    func saveLocked(
        _ document: DocumentState, durable: Bool, logging: Bool = false, wholeFiles: Bool = false,
        alongWith other: ((any DocumentStoreTransaction) throws -> Void)? = nil
    ) throws(Errno) -> Bool {
        if let prepared = try prepareShown(document, durable: durable, wholeFiles: wholeFiles) {
            if logging, store.logsIntents, log(document, prepared) { return true }
            let result: Result<SaveResult, Errno>
            do {
                // Cut and hashed before the transaction, which other saves wait for.
                let work = try storeCall { try store.prepare(prepared.changes) }
                if let other {
                    result = .success(
                        try storeCall {
                            try store.transaction(durable: prepared.changes.durable) { tx in
                                let saved = try tx.save(work)
                                try other(tx)
                                return saved
                            }
                        })
                } else {
                    result = .success(try storeCall { try store.save(work) })
                }
            } catch {
                result = .failure(error)
            }
            try finish(document, prepared, result)
            // Saved whole: a close or rename that asked the committer for it asked for this.
            state.withLock { state in if !document.dirty { state.closeSaves[document.id] = nil } }
        } else {
            if let other { try storeCall { try store.transaction(durable: durable) { tx in try other(tx) } } }
            try settleIntents(of: [document])
        }
        if state.withLock({ _ in document.needsReload && !document.dirty }) {
            try reloadLocked(document, force: false)
        }
        return false
    }

    /// Saves several documents as one store transaction (group commit): one commit, and one disk
    /// sync when `durable`, for all of them. A document whose save fails is saved on its own
    /// again, so that one bad save does not hold the others back. Returns the documents whose
    /// save failed.
    @discardableResult
    func save(group documents: [DocumentState], durable: Bool) -> [DocumentID] {
        let documents = documents.sorted { $0.id < $1.id }
        var ready: [(document: DocumentState, prepared: PreparedSave)] = []
        var locked: [DocumentState] = []
        var failed: [DocumentID] = []
        var unsaved: [DocumentState] = []
        for document in documents {
            do { try ensureLoaded(document) } catch {
                failed.append(document.id)
                continue
            }
            compileTexts(of: document)
            // In id order, as every holder of several of these locks takes them.
            document.saving.lock()
            locked.append(document)
            do {
                if let prepared = try prepareShown(document, durable: durable) {
                    ready.append((document, prepared))
                } else {
                    unsaved.append(document)
                }
            } catch {
                failed.append(document.id)
            }
        }
        do { try settleIntents(of: unsaved) } catch { failed += unsaved.map(\.id) }
        // Logged intents are retired by a durable commit only.
        let durable = durable || ready.contains { !$0.prepared.intents.isEmpty }
        var results: [Result<SaveResult, Errno>] = []
        // Nothing to commit (an fsync saved it first): no transaction, which on PostgreSQL is two
        // round trips with these documents' save locks held.
        if !ready.isEmpty {
            // Cut and hashed here, each document's on its own, outside the transaction.
            let work = ready.map { item in
                Result { () throws(Errno) in try storeCall { try store.prepare(item.prepared.changes) } }
            }
            let preparedWork = work.compactMap { try? $0.get() }
            do {
                var saved = try storeCall {
                    try store.transaction(durable: durable) { tx in try preparedWork.map { try tx.save($0) } }
                }[...]
                results = work.map { outcome in outcome.map { _ in saved.removeFirst() } }
            } catch {
                results = work.map { outcome in outcome.flatMap { _ in .failure(error) } }
            }
        }
        var retry: [DocumentState] = []
        for (item, result) in zip(ready, results) {
            do { try finish(item.document, item.prepared, result) } catch { retry.append(item.document) }
        }
        for document in locked { document.saving.unlock() }
        if ready.count > 1 {
            for document in retry {
                do { try save(document, durable: durable) } catch { failed.append(document.id) }
            }
        } else {
            failed += retry.map(\.id)
        }
        for document in documents where state.withLock({ _ in document.needsReload && !document.dirty }) {
            document.saving.lock()
            try? reloadLocked(document, force: false)
            document.saving.unlock()
        }
        return failed
    }

    /// The document's prepared save, unless the mount no longer shows it (deleted, replaced).
    private func prepareShown(_ document: DocumentState, durable: Bool, wholeFiles: Bool = false)
        throws(Errno)
        -> PreparedSave?
    {
        enum Outcome {
            case prepared(PreparedSave?)
            case busy(ViewNode)
        }
        while true {
            let outcome = try state.withLock { state throws(Errno) -> Outcome in
                guard state.documents[document.id] === document else { return .prepared(nil) }
                // A file whose change is still writing its spill waits to be frozen: what a save
                // reads must not change under it.
                if let busy = document.touched.values.lazy.map({ $0.linkOf ?? $0 })
                    .first(where: { $0.contents?.changing == true })
                {
                    return .busy(busy)
                }
                return .prepared(try prepare(&state, document, durable: durable, wholeFiles: wholeFiles))
            }
            switch outcome {
            case .prepared(let prepared):
                return prepared
            case .busy(let file):
                // The change holds this lock from before its plan until after its commit.
                file.changes.lock()
                file.changes.unlock()
            }
        }
    }

    /// Takes in what the store answered to a prepared save. The caller holds `document.saving`.
    private func finish(
        _ document: DocumentState, _ prepared: PreparedSave, _ outcome: Result<SaveResult, Errno>
    )
        throws(Errno)
    {
        let result: SaveResult
        switch outcome {
        case .failure(let error):
            state.withLock { _ in
                unprepare(document, prepared)
                document.lastError = error
            }
            logger.error("saving \(document.info.name) failed: \(error)")
            throw error
        case .success(let saved):
            result = saved
        }
        // Committed durably (a save with intents is), as a conflict version or not: a crash no
        // longer needs the log's copy.
        store.retireIntents(prepared.intents)
        // Cache layers of files no handle has open any more, let go after the lock.
        var dropped: [SpillLayer] = []
        defer { withExtendedLifetime(dropped) {} }
        let conflict = state.withLock { _ -> Bool in
            document.lastError = nil
            if result.isConflict {
                // Kept as a conflict version beside the current one; the mount shows the
                // current version again, and the conflict as an entry beside it (once the
                // observer sees the event), as `docfs versions` lists it.
                logger.warning(
                    "\(document.info.name): another process saved first; this save is kept as conflict \(result.version.id)"
                )
                document.needsReload = true
                for item in prepared.snapshots where item.node.contents === item.snapshot.contents {
                    item.snapshot.contents.saveFailed()
                }
                document.touched.merge(prepared.touched) { current, _ in current }
                return true
            }
            for item in prepared.snapshots where item.node.contents === item.snapshot.contents {
                item.snapshot.contents.saved(
                    item.snapshot, as: item.id, version: result.version.id, text: item.text)
                // Saved after its last close (a close's save): no handle will read or take in
                // those bytes, and in memory they would hold the budget for small files.
                if item.node.openHandles == 0 { dropped += item.snapshot.contents.dropClean() }
            }
            // In place: a copy of a big package's records would make every save cost the
            // size of the package.
            if document.committed == nil { document.committed = [:] }
            for (id, record) in prepared.records { document.committed?[id] = record }
            for id in prepared.changes.nodes.map(\.id) {
                document.committed?[id]?.version = result.version.id
            }
            for id in prepared.changes.removedNodes { document.committed?[id] = nil }
            document.base = result.version.id
            return false
        }
        if conflict {
            state.withLock { _ in document.dirty = false }
            try reloadLocked(document, force: true)
        }
    }

    /// Puts back what `prepared` took from the document, which it did not commit: the frozen
    /// layers stay under whatever was written since, and the next save looks at its nodes and
    /// commits its intents.
    private func unprepare(_ document: DocumentState, _ prepared: PreparedSave) {
        for item in prepared.snapshots where item.node.contents === item.snapshot.contents {
            item.snapshot.contents.saveFailed()
        }
        document.dirty = true
        document.touched.merge(prepared.touched) { current, _ in current }
        document.intents = prepared.intents + document.intents
    }

    /// Retires the intents of documents that had nothing left to save (their logged changes
    /// were committed since, or written over and committed) or that the mount no longer shows,
    /// once what the store holds for them is durable. The caller holds their `saving` locks.
    private func settleIntents(of documents: [DocumentState]) throws(Errno) {
        let settled = state.withLock { state -> [(DocumentState, [IntentID])] in
            var settled: [(DocumentState, [IntentID])] = []
            for document in documents
            where !document.intents.isEmpty && (!document.dirty || state.documents[document.id] !== document)
            {
                settled.append((document, document.intents))
                document.intents = []
            }
            return settled
        }
        guard !settled.isEmpty else { return }
        do { try storeCall { try store.synchronize() } } catch {
            // The next save of each document tries again.
            state.withLock { _ in
                for (document, intents) in settled { document.intents = intents + document.intents }
            }
            throw error
        }
        store.retireIntents(settled.flatMap(\.1))
    }

    /// Has the store log `prepared` instead of saving it, and leaves the save to the committer.
    /// False when the store would rather save at once, or cannot log: `prepared` stands.
    private func log(_ document: DocumentState, _ prepared: PreparedSave) -> Bool {
        let logged: IntentID?
        do {
            logged = try storeCall { try store.logIntent(prepared.changes) }
        } catch {
            // A durable save does without the log (a log folder that cannot be written); on a
            // full disk it fails too, and its error is what the fsync returns.
            logger.warning(
                "logging the changes of \(document.info.name) failed (\(error)); saving them at once")
            return false
        }
        guard let logged else { return false }
        state.withLock { state in
            unprepare(document, prepared)
            // The logged bytes stay as they are, for a save to store while the file is written
            // again before its own next close or fsync.
            for item in prepared.snapshots
            where item.text == nil && item.node.contents === item.snapshot.contents {
                item.snapshot.contents.hold(item.snapshot)
            }
            document.intents.append(logged)
            if state.loggedSaves[document.id] == nil { state.loggedSaves[document.id] = (document, .now) }
            // The record holds what an earlier close or rename asked to save: its save may wait
            // as a logged one does, and take in the next safe-saves' records too.
            state.closeSaves[document.id] = nil
        }
        committerWake.signal()
        return true
    }

    /// Computes the document's changes against its saved state and freezes the files it sends.
    /// Only the nodes touched since the last save are looked at.
    private func prepare(_ state: inout State, _ document: DocumentState, durable: Bool, wholeFiles: Bool)
        throws(Errno) -> PreparedSave?
    {
        guard let committed = document.committed else { return nil }
        let root = document.root
        // A document renamed away under a scratch name is not saved (it is still in the store
        // under its name); its changes wait.
        guard root.linked, root.atMountRoot, !isHidden(root, of: document),
            state.rootEntries[root.name] === root
        else { return nil }
        let touched = document.touched
        document.touched = [:]
        document.dirty = false
        var records: [StoreNodeID: NodeRecord] = [:]
        var gone: Set<StoreNodeID> = []
        var changes = DocumentChanges(document: document.id, base: document.base)
        changes.origin = origin
        changes.conflictPolicy = .rebaseIfDisjoint
        changes.durable = durable
        var snapshots:
            [(node: ViewNode, id: StoreNodeID, snapshot: FileContents.Snapshot, text: PropertyListText?)] =
                []
        // Property lists shown as text whose text is not compiled (or does not compile): they wait,
        // and so does the removal of what had their place (vim's renamed-away original).
        var held: [ViewNode] = []
        var goneNodes: [StoreNodeID: ViewNode] = [:]
        // Files whose size the kernel set ahead of the pages below it (``FileContents/sizeAhead``):
        // what the mount has of them is no state they ever had, so this save keeps their bytes
        // as last saved (or as their last fsync logged them), their names and attributes as
        // they are, and their bytes wait for their own close or fsync. Once the session ends
        // nothing is written any more: everything is saved; and so it is for a save a move
        // makes first (`wholeFiles`), which must leave nothing unsaved behind it.
        var inWriting = Set<ObjectIdentifier>()
        if !state.stopping && !wholeFiles {
            for node in touched.values where node.contents?.sizeAhead == true {
                inWriting.insert(ObjectIdentifier(node))
            }
        }
        var waiting: [ViewNode] = []

        for node in touched.values.sorted(by: { $0.storeID < $1.storeID }) {
            // A node a flat document's new file took over from is no longer the document's.
            guard node.document == document.id else { continue }
            guard isPersisted(node), node.linkOf.map({ isPersisted($0) }) ?? true else {
                if committed[node.persistAs] != nil {
                    gone.insert(node.persistAs)
                    goneNodes[node.persistAs] = node
                }
                continue
            }
            if let file = node.linkOf {
                // Another name of a file: a record of its place that names the file's node. The
                // store reads the rest from the file, so a change of the file leaves it alone.
                var record = file.record
                record.id = node.persistAs
                record.document = document.id
                record.parent = node.parent?.persistAs
                record.name = node.name.string
                record.preferredName = nil
                record.linkOf = file.persistAs
                let stored = committed[record.id]
                records[record.id] = record
                if stored?.linkOf != record.linkOf || stored?.parent != record.parent
                    || stored?.name != record.name
                {
                    changes.nodes.append(record)
                }
                continue
            }
            var record = node.record
            record.linkOf = nil
            record.id = node.persistAs
            record.document = document.id
            if node.atMountRoot {
                record.parent = nil
                record.name = document.info.name
                record.preferredName = committed[record.id]?.preferredName
            } else {
                record.parent = node.parent?.persistAs
                record.name = node.name.string
            }
            let stored = committed[record.id]
            if node.kind == .regularFile, let contents = node.contents,
                inWriting.contains(ObjectIdentifier(node))
            {
                waiting.append(node)
                if let checkpoint = contents.checkpoint, contents.propertyList == nil,
                    let change = contentChange(node, &record, stored: stored, snapshot: checkpoint)
                {
                    // What its last fsync logged.
                    if let snapshot = change.snapshot { snapshots.append((node, record.id, snapshot, nil)) }
                    if let update = change.update { changes.contents[record.id] = update }
                } else {
                    record.size = stored?.kind == .regularFile ? stored?.size ?? 0 : 0
                }
            } else if let change = contentChange(node, &record, stored: stored) {
                if change.held {
                    held.append(node)
                    continue
                }
                if let snapshot = change.snapshot {
                    snapshots.append((node, record.id, snapshot, change.text))
                }
                if let update = change.update { changes.contents[record.id] = update }
            }
            records[record.id] = record
            if changes.contents[record.id] != nil || !(stored.map { record.sameContent(as: $0) } ?? false) {
                changes.nodes.append(record)
            }
        }
        for node in waiting {
            document.touched[ObjectIdentifier(node)] = node
            document.dirty = true
        }
        var kept = Set<StoreNodeID>()
        for node in held {
            document.touched[ObjectIdentifier(node)] = node
            document.dirty = true
            // What had the waiting file's name stays in the store until the file can take it.
            for (id, gone) in goneNodes
            where committed[id]?.parent == node.parent?.persistAs && committed[id]?.name == node.name.string {
                document.touched[ObjectIdentifier(gone)] = gone
                kept.insert(id)
            }
        }
        changes.removedNodes = gone.subtracting(records.keys).subtracting(kept).sorted()
        guard !changes.isEmpty else {
            for item in snapshots { item.snapshot.contents.saveFailed() }
            return nil
        }
        let intents = document.intents
        document.intents = []
        if !intents.isEmpty { changes.durable = true }
        return PreparedSave(
            changes: changes, records: records, snapshots: snapshots, touched: touched, intents: intents)
    }

    /// What a save of the regular file `node` as `record` (its size set here) sends of its
    /// contents, over `stored`, the record the store has under that id (nil: none). Freezes what
    /// it sends. Nil for a node without contents of its own.
    func contentChange(
        _ node: ViewNode, _ record: inout NodeRecord, stored: NodeRecord?,
        snapshot given: FileContents.Snapshot? = nil
    ) -> ContentChange? {
        guard let contents = node.contents, node.kind == .regularFile else { return nil }
        let sameNode = contents.base.node == record.id && stored?.kind == .regularFile
        if contents.propertyList != nil, contents.isModified || contents.base.text != nil {
            // Stored as a binary property list, shown and written as text.
            if !contents.isModified, let shown = contents.base.text {
                record.size = Int64(shown.binary.count)
                if sameNode { return ContentChange() }
                return ContentChange(
                    update: .copy(of: NodeLookup(contents.base.node, at: contents.base.version)))
            }
            guard let compiled = contents.compiled, compiled.edits == contents.edits,
                case .success(let text) = compiled.outcome
            else { return ContentChange(held: true) }
            record.size = Int64(text.binary.count)
            // The text shown, written back: the archive stays byte for byte.
            if sameNode, text.binary == contents.base.text?.binary { return ContentChange() }
            return ContentChange(
                update: .replace(DataContentsSource(text.binary)), snapshot: contents.freeze(), text: text)
        }
        record.size = given?.size ?? contents.size
        guard contents.isModified || !sameNode || stored?.size != record.size else {
            return ContentChange()
        }
        let snapshot = given ?? contents.freeze()
        if sameNode || snapshot.base.size == 0 {
            let storedSize = stored?.kind == .regularFile ? stored?.size ?? 0 : 0
            let source = SnapshotSource(
                snapshot: snapshot, changedRanges: snapshot.changedRanges(storedSize: storedSize),
                heldRanges: snapshot.heldRanges)
            return ContentChange(
                update: .sparse(
                    size: snapshot.size,
                    chunks: snapshot.changedChunks(storedSize: storedSize, chunkSize: chunkSize),
                    source: source),
                snapshot: snapshot)
        }
        // The file was another one before (renamed over this name): the store starts from that
        // file's chunks and takes only the written ones.
        let source = SnapshotSource(
            snapshot: snapshot, changedRanges: snapshot.changedRanges(storedSize: snapshot.base.size),
            heldRanges: snapshot.heldRanges)
        return ContentChange(
            update: .derived(
                from: NodeLookup(snapshot.base.node, at: snapshot.base.version), size: snapshot.size,
                chunks: snapshot.changedChunks(storedSize: snapshot.base.size, chunkSize: chunkSize),
                source: source),
            snapshot: snapshot)
    }

    // MARK: - The quiet-interval saver

    func startSaver() {
        let quiet = configuration.quietInterval
        let pause = min(
            0.25,
            max(0.01, Double(quiet.components.seconds) + Double(quiet.components.attoseconds) / 1e18) / 4)
        let running = backgroundThreads
        running.enter()
        let thread = Thread { [weak self] in
            defer { running.leave() }
            while true {
                guard let self, !self.state.withLock({ $0.stopping }) else { return }
                self.saveQuietDocuments()
                Thread.sleep(forTimeInterval: pause)
            }
        }
        thread.name = "docfs.saver"
        state.withLock { $0.saver = thread }
        thread.start()
    }

    private func saveQuietDocuments() {
        let now = ContinuousClock.now
        let due = state.withLock { state -> [DocumentState] in
            guard !state.backgroundSavesHeld else { return [] }
            return state.documents.values.filter { document in
                (document.dirty || document.lastError != nil)
                    && now - document.lastChange >= configuration.quietInterval
            }
        }
        guard !due.isEmpty else { return }
        let failed = Set(save(group: due, durable: true))
        for document in due where failed.contains(document.id) {
            // Retried after the next quiet interval; close and fsync report it meanwhile.
            state.withLock { _ in document.lastChange = ContinuousClock.now }
        }
    }

    // MARK: - Group commit of closes

    /// Hands the document's save to the committer (group commit), which commits it within a few
    /// milliseconds: a save point (a close, a rename onto a wrapper's name) returns without
    /// waiting for the store. With `reporting`, returns the error of a save of the document that
    /// failed since the last report, once (what close(2) returns); its changes stay pending and
    /// are saved again.
    @discardableResult
    func commitSoon(_ document: DocumentState, reporting: Bool = false) -> Errno? {
        let failure = state.withLock { state -> Errno? in
            state.closeSaves[document.id] = document
            guard reporting else { return nil }
            defer { document.lastError = nil }
            return document.lastError
        }
        committerWake.signal()
        return failure
    }

    /// How long the save of an `fsync` that the store logged may wait for more: fsx's fsyncs
    /// come every few milliseconds, and a save per fsync (each a durable commit) took the second
    /// core and the disk from them (20,000 operations in 2.24–2.58 s against 1.69–1.85 s).
    static let loggedSaveDelay: Duration = .milliseconds(20)

    /// Saves what closes and logged fsyncs asked for, in the background: the close returns at
    /// once, and the closes that come while a commit runs, or within two milliseconds of the
    /// first, are committed together as one store transaction (``save(group:durable:)``), with
    /// every logged document. A logged document alone waits up to ``loggedSaveDelay``.
    func startCommitter() {
        let running = backgroundThreads
        running.enter()
        let thread = Thread { [weak self] in
            defer { running.leave() }
            while true {
                guard let wake = self?.committerWake else { return }
                _ = wake.wait(timeout: .now() + (self?.committerSleep() ?? 0.25))
                guard let self, !self.state.withLock({ $0.stopping }) else { return }
                let now = ContinuousClock.now
                let (closes, loggedDue) = self.state.withLock { state -> (Bool, Bool) in
                    guard !state.backgroundSavesHeld else { return (false, false) }
                    return (
                        !state.closeSaves.isEmpty,
                        state.loggedSaves.values.contains { now - $0.since >= Self.loggedSaveDelay }
                    )
                }
                guard closes || loggedDue else { continue }
                if closes { usleep(2_000) }
                let group = self.state.withLock { state -> [DocumentState] in
                    var group = state.closeSaves
                    for (id, logged) in state.loggedSaves { group[id] = logged.document }
                    state.closeSaves = [:]
                    state.loggedSaves = [:]
                    return Array(group.values)
                }
                self.save(group: group, durable: false)
            }
        }
        thread.name = "docfs.committer"
        thread.start()
    }

    /// Seconds the committer may sleep: until the oldest logged save is due, at most 0.25.
    private func committerSleep() -> Double {
        guard let oldest = state.withLock({ $0.loggedSaves.values.map(\.since).min() }) else { return 0.25 }
        let left = oldest + Self.loggedSaveDelay - ContinuousClock.now
        return min(0.25, max(0, Double(left / .microseconds(1)) / 1e6))
    }

    // MARK: - History that thins itself

    /// Applies the store's retention policy when it is due, a minute after mounting and then
    /// every few minutes, on a thread of its own: saves never wait for it, and the versions this
    /// mount still reads from are protected.
    func startCollector() {
        guard let interval = configuration.collectionInterval, !configuration.readOnly else { return }
        let running = backgroundThreads
        running.enter()
        let thread = Thread { [weak self] in
            defer { running.leave() }
            var next = ContinuousClock.now + min(interval, .seconds(60))
            while true {
                guard let self, !self.state.withLock({ $0.stopping }) else { return }
                if ContinuousClock.now >= next {
                    next = ContinuousClock.now + min(interval, .seconds(600))
                    self.collectIfDue(every: interval)
                }
                Thread.sleep(forTimeInterval: 0.5)
            }
        }
        thread.name = "docfs.collector"
        thread.start()
    }

    func collectIfDue(every interval: Duration) {
        let protected = versionsInUse()
        do {
            if let report = try store.collectGarbageIfDue(every: interval, protecting: protected) {
                logger.info(
                    "retention: \(report.versionsRemoved) versions and \(report.documentsRemoved) deleted documents dropped, \(report.bytesFreed) bytes freed"
                )
            }
        } catch {
            logger.warning("retention: \(error)")
        }
    }

    /// The versions this mount reads from: every document's base and every file's contents base.
    func versionsInUse() -> Set<VersionID> {
        state.withLock { state in
            var versions = Set(state.documents.values.map(\.base))
            for node in state.nodes.values {
                if let version = node.contents?.base.version { versions.insert(version) }
            }
            for file in state.files.values {
                if let version = file.snapshot?.version { versions.insert(version) }
            }
            return versions
        }
    }

    // MARK: - Other processes' changes

    /// Called on the observer's thread with other processes' (and our own) store events.
    func storeChanged(_ events: [StoreEvent]) {
        let foreign = events.filter { $0.origin != origin }
        // A conflict (ours included) or its resolution changes the conflict entries at the root.
        // A save of a document this mount does not show means that the listing that should have
        // brought it in failed or was dropped: list again rather than miss it until the next
        // create, rename or delete.
        let unknown = state.withLock { state in
            state.listed && foreign.contains { state.documents[$0.document] == nil }
        }
        if unknown || events.contains(where: { $0.kind != .saved }) {
            refreshListing()
        }
        for id in Set(foreign.map(\.document)) {
            guard let document = state.withLock({ $0.documents[id] }) else { continue }
            state.withLock { _ in document.needsReload = true }
            do {
                document.saving.lock()
                defer { document.saving.unlock() }
                try reloadLocked(document, force: false)
            } catch {
                logger.warning("cannot refresh \(document.info.name): \(error)")
            }
        }
    }

    /// Revalidates a node's document before an open (close-to-open consistency).
    func revalidate(_ node: ViewNode) throws(Errno) {
        guard let document = state.withLock({ self.document(&$0, of: node) }) else { return }
        let (base, loaded) = state.withLock { _ in (document.base, document.isLoaded) }
        guard loaded else { return }
        let current: VersionID
        do {
            current = try store.currentVersion(of: document.id)
        } catch DocumentStoreError.io(let message) {
            // The store cannot be reached (a database server restarting, a network cut): serve
            // what this mount has, as a mount of a network store does; saves still fail with EIO.
            logger.warning("cannot revalidate \(document.info.name), serving it as last seen: \(message)")
            return
        } catch {
            try storeCall { throw error }  // as the errno the caller should see
            return
        }
        guard current != base else { return }
        state.withLock { _ in document.needsReload = true }
        document.saving.lock()
        defer { document.saving.unlock() }
        try reloadLocked(document, force: false)
    }

    /// Reads the document's current tree and shows it, unless the mount has unsaved changes
    /// (then the next save is applied on top, or kept as a conflict, and reloads after).
    /// The caller holds `document.saving`.
    func reloadLocked(_ document: DocumentState, force: Bool) throws(Errno) {
        let proceed = state.withLock { _ -> Bool in
            guard force || document.needsReload else { return false }
            return force || !(document.dirty || anyModified(document.root))
        }
        guard proceed else { return }
        let info = try storeCall { try store.document(document.id) }
        let loaded = state.withLock { _ in document.isLoaded }
        if !loaded {
            guard let root = try storeCall({ try store.node(info.root, at: info.currentVersion) }) else {
                return
            }
            let notices = state.withLock { _ -> [Notice] in
                document.base = info.currentVersion
                document.needsReload = false
                guard document.root.persistAs == root.id, !document.root.contentsModified,
                    !document.root.record.sameContent(as: root)
                        || document.root.contents?.base.version != root.version
                else { return [] }
                var updated = root
                updated.name = document.root.record.name
                document.root.record = updated
                document.root.contents?.reset(
                    to: ContentBase(node: root.id, version: root.version, size: root.size))
                var notices: [Notice] = [.inode(document.root.ino)]
                renew(document.root, &notices)
                return notices
            }
            send(notices)
            return
        }
        let records = try storeCall { try store.nodes(of: document.id, at: info.currentVersion) }
        let notices = state.withLock { state -> [Notice] in
            guard force || !(document.dirty || anyModified(document.root)) else { return [] }
            document.needsReload = false
            return apply(&state, document, records: records, version: info.currentVersion)
        }
        send(notices)
    }

    /// Whether a wrapper of the tree has bytes the store lacks. Scratch files are not counted:
    /// their bytes are never saved, and a reload keeps them, so an editor's swap file does not
    /// hold back another process's saves for as long as it stays open.
    private func anyModified(_ node: ViewNode) -> Bool {
        if node.contentsModified && !isScratch(node) { return true }
        return node.children.values.contains { anyModified($0) }
    }

    /// With the writeback cache the kernel keeps a file's size and times and ignores the
    /// daemon's, so a file whose contents changed other than through it gets a new kernel
    /// inode: its names are invalidated and their next lookup makes that inode. Open files keep
    /// the old one, and reads through them keep to what they opened; an open of the old one is
    /// refused with `ESTALE`, which makes the kernel look the name up again (``open``).
    func renew(_ node: ViewNode, _ notices: inout [Notice]) {
        guard writeback.load(ordering: .relaxed), node.kind == .regularFile else { return }
        let file = node.linkOf ?? node
        var retired = table.retire(file.ino)
        for key in file.kernelAliases where table.retire(key) {
            retired = true
            notices.append(.inode(key))
        }
        guard retired else { return }
        for name in [file] + Array(file.aliases.values) where name.linked {
            notices.append(.entry(parent: name.parent?.ino ?? mountRootInode, name: name.name))
        }
    }

    enum Notice {
        case inode(UInt64)
        case entry(parent: UInt64, name: FUSE.FileName)
        case delete(parent: UInt64, child: UInt64, name: FUSE.FileName)
    }

    /// Shows `records` (the document at `version`) in the tree, keeping scratch files and nodes
    /// that are unchanged. Returns what the kernel must forget.
    private func apply(
        _ state: inout State, _ document: DocumentState, records: [NodeRecord], version: VersionID
    )
        -> [Notice]
    {
        var notices: [Notice] = []
        let old = document.committed ?? [:]
        var byID: [StoreNodeID: ViewNode] = [:]
        var scratch: [(parent: StoreNodeID, node: ViewNode)] = []
        func collect(_ node: ViewNode) {
            guard node.linked else { return }
            byID[node.persistAs] = node
            for child in node.children.values {
                if child.kind != .directory && configuration.scratchNames.matches(child.name) {
                    scratch.append((node.persistAs, child))
                } else {
                    collect(child)
                }
            }
        }
        collect(document.root)
        let parentIno: (ViewNode) -> UInt64 = { $0.parent?.ino ?? mountRootInode }
        var seen: Set<StoreNodeID> = []
        for record in records {
            seen.insert(record.id)
            if let node = byID[record.id], (node.linkOf == nil) != (record.linkOf == nil) {
                // A name that stopped (or started) being another name of a file: a new node.
                node.linked = false
                byID[record.id] = nil
            }
            if let node = byID[record.id] {
                let before = old[record.id]
                if before == nil || before?.version != record.version || !node.record.sameContent(as: record)
                {
                    // The root's name is the document's, which the root listing follows.
                    let keepName = node.atMountRoot ? node.name : FUSE.FileName(record.name)
                    if node.name != keepName || (node.parent?.persistAs != record.parent && !node.atMountRoot)
                    {
                        notices.append(.entry(parent: parentIno(node), name: node.name))
                    }
                    var updated = record
                    if node.atMountRoot { updated.name = node.record.name }
                    node.record = updated
                    node.name = keepName
                    if let contents = node.contents,
                        before?.version != record.version || contents.size != record.size
                    {
                        contents.reset(
                            to: ContentBase(node: record.id, version: record.version, size: record.size))
                        renew(node, &notices)
                    }
                    notices.append(.inode(node.ino))
                }
            } else {
                let node = makeNode(
                    storeID: record.id, document: document.id, record: record,
                    name: FUSE.FileName(record.name))
                byID[record.id] = node
                if record.linkOf == nil { state.nodes[node.ino] = node }
            }
        }
        // Relink every saved node under its parent, then put scratch files back.
        for node in byID.values where !node.atMountRoot {
            node.children = node.children.filter { isScratch($0.value) }
        }
        document.root.children = document.root.children.filter { isScratch($0.value) }
        for record in records where record.id != document.info.root {
            guard let node = byID[record.id], let parentID = record.parent, let parent = byID[parentID] else {
                continue
            }
            if node.parent !== parent, let previous = node.parent { notices.append(.inode(previous.ino)) }
            node.parent = parent
            node.linked = true
            parent.children[node.name] = node
        }
        for (id, node) in byID where !seen.contains(id) {
            if let parent = node.parent {
                notices.append(
                    .delete(parent: parent.ino, child: (node.linkOf ?? node).ino, name: node.name))
                notices.append(.inode(parent.ino))
            }
            node.linked = false
            if node.linkOf == nil, node.openHandles == 0, table.node(for: node.ino) == nil {
                state.nodes[node.ino] = nil
            }
        }
        let before = byID.values.filter { $0.linkOf != nil || !$0.aliases.isEmpty }
        Self.joinLinks(records, byID)
        // Scratch names of files (never saved) are names all the same.
        for (_, node) in scratch where node.linked {
            if let file = node.linkOf { file.aliases[ObjectIdentifier(node)] = node }
        }
        // Files whose names changed show their new link counts.
        for node in before + byID.values.filter({ !$0.aliases.isEmpty }) {
            notices.append(.inode((node.linkOf ?? node).ino))
        }
        // Scratch files stayed among their folders' children: they stay there, linked, unless
        // their folder is gone or a saved wrapper took the name. (Taking "still there" for
        // "taken" unlinked every scratch file at every reload while it stayed listed: renamed
        // to a real name, as rsync and GIO publish theirs, it was never saved.)
        for (parentID, node) in scratch {
            let parent = byID[parentID]
            if let parent, seen.contains(parentID), parent.children[node.name].map({ $0 === node }) ?? true {
                parent.children[node.name] = node
            } else {
                if let parent, parent.children[node.name] === node { parent.children[node.name] = nil }
                node.linked = false
            }
        }
        var committed: [StoreNodeID: NodeRecord] = [:]
        for record in records { committed[record.id] = record }
        for record in records where old[record.id] == nil {
            guard let parent = record.parent.flatMap({ byID[$0] }) else { continue }
            notices.append(.inode(parent.ino))
            // The kernel may have cached the name as missing.
            notices.append(.entry(parent: parent.ino, name: FUSE.FileName(record.name)))
        }
        document.committed = committed
        document.base = version
        // What the mount still has that the store does not (after a conflict: changes to
        // wrappers the other save did not touch) is saved by the next save.
        document.touched = [:]
        for node in byID.values where node.linked {
            if node.contentsModified
                || !(committed[node.persistAs].map { node.record.sameContent(as: $0) } ?? false)
            {
                document.touched[ObjectIdentifier(node)] = node
                document.dirty = true
            }
        }
        return notices
    }

    /// Tells the kernel what changed (from the calling thread, never inside a request handler).
    /// Queues `notices` for the kernel; with `waitingUpTo`, returns once the kernel has taken
    /// them (or the time is up). Never wait from a request handler: an invalidation can need a
    /// lock the kernel holds for that very request.
    func send(_ notices: [Notice], waitingUpTo timeout: Duration? = nil, again: Bool = true) {
        guard !notices.isEmpty, let notifier = state.withLock({ $0.notifier }) else { return }
        if again {
            // A lookup the kernel sent before this change and answers after it instantiates its
            // inode with the old attributes, which an invalidation sent meanwhile (the kernel did
            // not know the inode yet) cannot reach: they would stand until the attribute timeout.
            // The same invalidations once more, a moment later, catch such a reply.
            let repeated = notices.filter { if case .delete = $0 { false } else { true } }
            if !repeated.isEmpty {
                DispatchQueue.global().asyncAfter(deadline: .now() + 0.25) { [self] in
                    send(repeated, again: false)
                }
            }
        }
        var sentInodes: Set<UInt64> = []
        let taken = DispatchGroup()
        let done: Notifier.Completion?
        if timeout != nil {
            done = { @Sendable _ in taken.leave() }
        } else {
            done = nil
        }
        func track() { if done != nil { taken.enter() } }
        for notice in notices {
            switch notice {
            case .inode(let ino):
                guard sentInodes.insert(ino).inserted else { continue }
                if ino == mountRootInode {
                    track()
                    notifier.invalidateInode(.root, completion: done)
                } else {
                    // A renewed file's old inode too: open files' pages and attributes.
                    for node in table.nodes(for: ino) {
                        track()
                        notifier.invalidateInode(node, completion: done)
                    }
                }
            case .entry(let parent, let name):
                let parentNode = parent == mountRootInode ? NodeID.root : table.node(for: parent)
                if let parentNode {
                    track()
                    notifier.invalidateEntry(parent: parentNode, name: name, completion: done)
                }
            case .delete(let parent, let child, let name):
                let parentNode = parent == mountRootInode ? NodeID.root : table.node(for: parent)
                guard let parentNode else { continue }
                track()
                if let childNode = table.node(for: child) {
                    notifier.delete(parent: parentNode, child: childNode, name: name, completion: done)
                } else {
                    notifier.invalidateEntry(parent: parentNode, name: name, completion: done)
                }
            }
        }
        if let timeout {
            let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
            if taken.wait(timeout: .now() + seconds) == .timedOut {
                logger.debug("the kernel had not taken every invalidation after \(timeout)")
            }
        }
    }

    /// Reads the root listing again and shows documents other processes created, renamed or
    /// deleted.
    func refreshListing() {
        // A listing taken while this mount creates, renames or deletes a document is stale
        // for that document: applying it would undo the change (the new name vanishes, the old
        // one comes back). Such a listing is dropped and taken again.
        // A listing that fails (a store that cannot be reached) is tried again a little later;
        // after that, the next event of a document this mount does not show lists again.
        var failures = 0
        for _ in 0..<8 {
            switch refreshListingOnce() {
            case .done: return
            case .stale: continue
            case .failed:
                failures += 1
                if failures == 3 { return }
                usleep(UInt32(failures) * 200_000)
            }
        }
        logger.warning("the store's listing kept changing under this mount's own changes; refreshed later")
    }

    private enum ListingRefresh { case done, stale, failed }

    /// One try of ``refreshListing()``: stale if this mount changed its documents meanwhile.
    private func refreshListingOnce() -> ListingRefresh {
        guard let generation = state.withLock({ $0.listed ? $0.rootGeneration : nil }) else { return .done }
        let infos: [DocumentInfo]
        do {
            infos = try store.documents().filter { !Self.isReservedAtRoot(FUSE.FileName($0.name)) }
        } catch {
            logger.warning("cannot list the store: \(error)")
            return .failed
        }
        let known = state.withLock { Set($0.documents.keys) }
        let roots: [DocumentID: NodeRecord]
        do {
            roots = try rootRecords(of: infos.filter { !known.contains($0.id) })
        } catch {
            logger.warning("cannot read the store's new documents: \(error)")
            return .failed
        }
        let conflicts = fetchConflicts(
            roots: Dictionary(infos.map { ($0.id, $0.root) }) { first, _ in first })
        let notices = state.withLock { state -> [Notice]? in
            guard state.rootGeneration == generation else { return nil }
            var notices: [Notice] = []
            let live = Dictionary(uniqueKeysWithValues: infos.map { ($0.id, $0) })
            for (id, document) in state.documents {
                guard let info = live[id] else {
                    // Deleted by someone else.
                    let node = document.root
                    if state.rootEntries[node.name] === node {
                        state.rootEntries[node.name] = nil
                        notices.append(.delete(parent: mountRootInode, child: node.ino, name: node.name))
                    }
                    node.linked = false
                    state.documents[id] = nil
                    continue
                }
                if info.name != document.info.name {
                    let node = document.root
                    let oldName = FUSE.FileName(document.info.name)
                    document.info.name = info.name
                    if state.rootEntries[oldName] === node {
                        state.rootEntries[oldName] = nil
                        notices.append(.entry(parent: mountRootInode, name: oldName))
                        let newName = FUSE.FileName(info.name)
                        if state.rootEntries[newName] == nil {
                            node.name = newName
                            node.record.name = info.name
                            state.rootEntries[newName] = node
                            notices.append(.entry(parent: mountRootInode, name: newName))
                        }
                    }
                }
            }
            for (id, record) in roots where state.documents[id] == nil {
                guard let info = live[id] else { continue }
                _ = install(&state, info: info, rootRecord: record)
                notices.append(.entry(parent: mountRootInode, name: FUSE.FileName(info.name)))
            }
            if let conflicts {
                notices += reconcileConflicts(
                    &state, versions: conflicts.versions, records: conflicts.records)
            }
            state.rootChanged = .now
            notices.append(.inode(mountRootInode))
            return notices
        }
        guard let notices else { return .stale }
        // Called on the observer's thread, never a request's: waiting is safe, and a name that
        // left the listing no longer resolves from the kernel's cache once this returns.
        send(notices, waitingUpTo: .seconds(2))
        return .done
    }
}
