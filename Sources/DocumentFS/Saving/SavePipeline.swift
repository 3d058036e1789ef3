import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import VersionedStore

/// Saving documents: the one save pipeline (prepare under the view lock, cut and hash outside the
/// store's write lock, commit, finish), for closes, `fsync`s, the quiet saver and unmount.
final class SavePipeline: MountRoom {
    let view: MountView
    let texts: PropertyListTexts
    let reconciler: Reconciler
    /// The saves the committer owes, and the background threads' lifetime.
    let saveQueue = SaveQueue(loggedDelay: SavePipeline.loggedSaveDelay)

    init(view: MountView, texts: PropertyListTexts, reconciler: Reconciler) {
        self.view = view
        self.texts = texts
        self.reconciler = reconciler
    }
}

extension SavePipeline {
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
        texts.compileTexts(of: document)
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
            state.withLock { _ in if !document.dirty { saveQueue.saved(document.id) } }
        } else {
            if let other { try storeCall { try store.transaction(durable: durable) { tx in try other(tx) } } }
            try settleIntents(of: [document])
        }
        if state.withLock({ _ in document.needsReload && !document.dirty }) {
            try reconciler.reloadLocked(document, force: false)
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
            texts.compileTexts(of: document)
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
            try? reconciler.reloadLocked(document, force: false)
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
                for item in prepared.snapshots { item.node.contents(for: item.snapshot)?.saveFailed() }
                document.touched.merge(prepared.touched) { current, _ in current }
                return true
            }
            for item in prepared.snapshots {
                guard let contents = item.node.contents(for: item.snapshot) else { continue }
                contents.saved(item.snapshot, as: item.id, version: result.version.id, text: item.text)
                // Saved after its last close (a close's save): no handle will read or take in
                // those bytes, and in memory they would hold the budget for small files.
                if item.node.openHandles == 0 { dropped += contents.dropClean() }
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
            try reconciler.reloadLocked(document, force: true)
        }
    }

    /// Puts back what `prepared` took from the document, which it did not commit: the frozen
    /// layers stay under whatever was written since, and the next save looks at its nodes and
    /// commits its intents.
    private func unprepare(_ document: DocumentState, _ prepared: PreparedSave) {
        for item in prepared.snapshots { item.node.contents(for: item.snapshot)?.saveFailed() }
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
            for item in prepared.snapshots where item.text == nil {
                item.node.contents(for: item.snapshot)?.hold(item.snapshot)
            }
            document.intents.append(logged)
        }
        saveQueue.logged(document.id)
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
            for item in snapshots { item.node.contents(for: item.snapshot)?.saveFailed() }
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

    /// Saves every document with unsaved changes; returns the documents whose save failed.
    @discardableResult
    func saveAll(durable: Bool) -> [DocumentID] {
        saveQueue.takeAll()
        let pending = state.withLock { state in
            state.documents.values.filter { $0.dirty || $0.lastError != nil }
        }
        let failed = save(group: pending, durable: durable)
        for document in pending where failed.contains(document.id) {
            logger.error("cannot save \(document.info.name)")
        }
        return failed
    }
}
