import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import VersionedStore

/// Renames that move a file or folder from one document into another, or between a package and
/// the mount root. Each is one store transaction that gives both documents a new version (a
/// document moved into a package is deleted in it, a wrapper moved to the root becomes a
/// document in it), so `rename(2)` never answers `EXDEV` for them.
///
/// The moved wrappers get new store nodes in the document they join (a node belongs to one
/// document); their contents are shared, not copied. The kernel's inode for them stays the same
/// for as long as the mount runs.
extension NameOperations {
    /// What one move commits, planned under the lock from saved state.
    private struct MovePlan {
        var source: DocumentState
        /// The package it goes into; nil when it goes to the root as a document of its own.
        var destination: DocumentState?
        var node: ViewNode
        /// The persisted nodes that move, the moved node first, each with its new store id.
        var moved: [(node: ViewNode, newID: StoreNodeID)]
        /// The source's changes (nil when the moved node is the source's root: the document goes).
        var sourceChanges: DocumentChanges?
        /// The destination package's changes, without the moved records (added in the
        /// transaction, when a new document's ids are known).
        var destinationChanges: DocumentChanges?
        /// A document at the root that the move replaces.
        var replacedDocument: DocumentState?
        /// A scratch file at the root that the move replaces.
        var replacedScratch: ViewNode?
        /// Names in the source that named a moved file, or moved names of files that stay,
        /// which become files of their own (a link cannot cross documents): the name's node,
        /// the store id it keeps, and the file whose bytes it takes.
        var copies: [(name: ViewNode, file: ViewNode)]
    }

    /// `rename(2)` of `name` in `parent` to `newName` in `newParent` where the two are not in one
    /// document. Scratch files move in the mount only.
    func moveAcross(
        _ parent: NodeID, _ name: FUSE.FileName, _ newParent: NodeID, _ newName: FUSE.FileName,
        _ newText: String, flags: RenameFlags
    ) throws(Errno) {
        if parent == .root || newParent == .root { try ensureListing() }
        let from = try resolver.resolve(parent, loadingChildren: true)
        let to = try resolver.resolve(newParent, loadingChildren: true)
        try conflictCopies.refuseConflict(from)
        try conflictCopies.refuseConflict(to)
        if flags.contains(.exchange) {
            try exchangeAcross(from, name, to, newName, newText)
            return
        }
        if from == nil, let to,
            let entry = state.withLock({ state in
                state.rootEntries[name].flatMap { conflictEntry(&state, of: $0) }
            })
        {
            // Keep both: the conflict version becomes wrappers of the package.
            try conflictCopies.copyConflict(entry, into: to, as: newName, newText, flags: flags)
            return
        }
        if try moveScratch(from, name, to, newName, newText, flags: flags) { return }
        // Saved state on both sides first, so that the move is the only change it commits.
        let (source, destination) = try state.withLock {
            state throws(Errno) -> (DocumentState, DocumentState?) in
            guard let node = from?.children[name] ?? (from == nil ? state.rootEntries[name] : nil) else {
                throw .noSuchFileOrDirectory
            }
            guard let source = document(&state, of: node), !isHidden(source.root, of: source) else {
                throw .improperLink
            }
            return (source, to.flatMap { document(&state, of: $0) })
        }
        for attempt in 0..<3 {
            try saving.save(source, durable: false, wholeFiles: true)
            if let destination { try saving.save(destination, durable: false, wholeFiles: true) }
            if let destination { try ensureLoaded(destination) }
            try ensureLoaded(source)
            guard let plan = try planMove(from, name, to, newName, newText, flags: flags) else {
                if attempt == 2 { throw .resourceBusy }
                continue
            }
            try commit([MoveLeg(plan: plan, newName: newName, newText: newText, to: to)], exchanging: false)
            return
        }
    }

    /// `renameat2(RENAME_EXCHANGE)` of two names in different documents: two moves, each into
    /// the other's place, as one store transaction.
    private func exchangeAcross(
        _ from: ViewNode?, _ name: FUSE.FileName, _ to: ViewNode?, _ newName: FUSE.FileName, _ newText: String
    ) throws(Errno) {
        let names = try state.withLock { state throws(Errno) -> (DocumentState, DocumentState) in
            guard let node = from?.children[name] ?? (from == nil ? state.rootEntries[name] : nil),
                let other = to?.children[newName] ?? (to == nil ? state.rootEntries[newName] : nil)
            else { throw .noSuchFileOrDirectory }
            // Scratch files and conflict entries have no document to trade places with.
            guard let first = document(&state, of: node), let second = document(&state, of: other),
                isPersisted(node), isPersisted(other), node.conflict == nil, other.conflict == nil
            else { throw .improperLink }
            if let to, node.kind == .directory, to.isDescendant(of: node) { throw .invalidArgument }
            if let from, other.kind == .directory, from.isDescendant(of: other) { throw .invalidArgument }
            return (first, second)
        }
        let oldText = name.string
        for attempt in 0..<3 {
            try saving.save(names.0, durable: false, wholeFiles: true)
            try saving.save(names.1, durable: false, wholeFiles: true)
            try ensureLoaded(names.0)
            try ensureLoaded(names.1)
            guard let there = try planMove(from, name, to, newName, newText, flags: [], exchanging: true),
                let back = try planMove(to, newName, from, name, oldText, flags: [], exchanging: true)
            else {
                if attempt == 2 { throw .resourceBusy }
                continue
            }
            try commit(
                [
                    MoveLeg(plan: there, newName: newName, newText: newText, to: to),
                    MoveLeg(plan: back, newName: name, newText: oldText, to: from),
                ], exchanging: true)
            return
        }
    }

    /// A scratch file (never saved) moves between documents in the mount only; returns whether
    /// it was one.
    private func moveScratch(
        _ from: ViewNode?, _ name: FUSE.FileName, _ to: ViewNode?, _ newName: FUSE.FileName,
        _ newText: String,
        flags: RenameFlags
    ) throws(Errno) -> Bool {
        let publish = try state.withLock { state throws(Errno) -> DocumentState?? in
            guard let node = from?.children[name] ?? (from == nil ? state.rootEntries[name] : nil) else {
                throw .noSuchFileOrDirectory
            }
            if node.conflict != nil { return .none }
            let scratch =
                from == nil
                ? (node.document == nil || document(&state, of: node).map { isHidden(node, of: $0) } == true)
                : !isPersisted(node)
            guard scratch, node.kind != .directory else { return .none }
            guard let to else {
                // Into the root under its scratch name; the root's own rename publishes it.
                guard state.rootEntries[name] == nil, configuration.scratchNames.matches(name) else {
                    throw .improperLink
                }
                from?.children[name] = nil
                node.parent = nil
                node.document = nil
                node.atMountRoot = true
                state.rootEntries[name] = node
                state.rootChanged = .now
                return .some(nil)
            }
            guard to.kind == .directory, to.linked else { throw .noSuchFileOrDirectory }
            let target = to.children[newName]
            if flags.contains(.noReplace) && target != nil { throw .fileExists }
            if let target {
                if target.kind == .directory { throw .isDirectory }
                unlinkName(&state, target)
            }
            try checkNoEquivalent(newText, in: to.children, except: target)
            if let from { from.children[name] = nil } else { state.rootEntries[name] = nil }
            node.document = to.document
            node.parent = to
            node.atMountRoot = false
            node.name = newName
            node.record.name = newText
            node.record.parent = to.persistAs
            node.record.document = to.record.document
            if node.storeID != node.persistAs { node.persistAs = node.storeID }
            to.children[newName] = node
            state.nodes[node.ino] = node
            let now = Timestamp.now
            node.record.changed = now
            to.record.modified = now
            to.record.changed = now
            if from == nil { state.rootChanged = .now }
            changed(&state, node)
            changed(&state, to)
            // Published under a wrapper's name: a save point, as a rename within a package.
            return isPersisted(node) ? .some(document(&state, of: node)) : .some(nil)
        }
        switch publish {
        case .none: return false
        case .some(.none):
            if to == nil { try renameAtRoot(name, newName, newText, flags: flags) }
            return true
        case .some(.some(let document)):
            try saving.save(document, durable: false)
            return true
        }
    }

    /// Plans the move from saved state; nil when something changed since the saves (try again).
    private func planMove(
        _ from: ViewNode?, _ name: FUSE.FileName, _ to: ViewNode?, _ newName: FUSE.FileName,
        _ newText: String,
        flags: RenameFlags, exchanging: Bool = false
    ) throws(Errno) -> MovePlan? {
        // New store ids for every node that moves, taken before the lock.
        let count = try state.withLock { state throws(Errno) -> Int in
            guard let node = from?.children[name] ?? (from == nil ? state.rootEntries[name] : nil) else {
                throw .noSuchFileOrDirectory
            }
            return subtree(node).count
        }
        let ids = try newStoreIDs(count: count)
        return try state.withLock { state throws(Errno) -> MovePlan? in
            guard let node = from?.children[name] ?? (from == nil ? state.rootEntries[name] : nil),
                let source = document(&state, of: node)
            else { throw .noSuchFileOrDirectory }
            let destination = to.flatMap { document(&state, of: $0) }
            guard source.id != destination?.id else { throw .improperLink }
            let nodes = subtree(node)
            guard nodes.count == ids.count else { return nil }
            // Anything unsaved since the saves (a write racing the rename): save again first.
            if source.dirty || destination?.dirty == true || nodes.contains(where: \.contentsModified) {
                return nil
            }
            if let to {
                guard to.kind == .directory, to.linked else { throw .noSuchFileOrDirectory }
                if node.kind == .directory && to.isDescendant(of: node) { throw .invalidArgument }
            }
            // In an exchange the name's holder moves the other way, in the same transaction.
            let target = exchanging ? nil : to.map { $0.children[newName] } ?? state.rootEntries[newName]
            if let target, target.conflict != nil { throw .notPermitted }
            if flags.contains(.noReplace) && target != nil { throw .fileExists }
            if let target { try checkReplaceable(target, by: node.kind) }
            if let to, !exchanging { try checkNoEquivalent(newText, in: to.children, except: target) }
            let now = Timestamp.now
            var plan = MovePlan(
                source: source, destination: destination, node: node,
                moved: Array(zip(nodes, ids)).map { (node: $0.0, newID: $0.1) }, copies: [])
            let movedSet = Set(nodes.map { ObjectIdentifier($0) })

            // The source loses the node (or, for its root, the whole document).
            if !node.atMountRoot {
                var changes = DocumentChanges(document: source.id, base: source.base)
                changes.origin = origin
                changes.conflictPolicy = .rebaseIfDisjoint
                changes.removedNodes = [node.persistAs]
                if let parent = node.parent, var record = source.committed?[parent.persistAs] {
                    record.modified = now
                    record.changed = now
                    changes.nodes.append(record)
                }
                // Names left behind that name a moved file become files of their own, sharing
                // one node: the first keeps its store id, the others name it.
                for moved in nodes where moved.linkOf == nil {
                    let staying = moved.aliases.values.filter { !movedSet.contains(ObjectIdentifier($0)) }
                        .sorted { $0.storeID < $1.storeID }
                    guard let heir = staying.first, var record = source.committed?[heir.persistAs] else {
                        continue
                    }
                    record.linkOf = nil
                    changes.nodes.append(record)
                    changes.contents[record.id] = .copy(of: NodeLookup(moved.persistAs, at: source.base))
                    for other in staying.dropFirst() {
                        guard var link = source.committed?[other.persistAs] else { continue }
                        link.linkOf = heir.persistAs
                        changes.nodes.append(link)
                    }
                    plan.copies.append((heir, moved))
                }
                plan.sourceChanges = changes
            }
            // The destination package: the name the move replaces goes.
            if let destination {
                var changes = replacing(target, in: destination)
                if let to, var record = destination.committed?[to.persistAs] {
                    record.modified = now
                    record.changed = now
                    changes.nodes.append(record)
                }
                plan.destinationChanges = changes
            } else if let target {
                if let replaced = document(&state, of: target), !isHidden(target, of: replaced) {
                    plan.replacedDocument = replaced
                } else {
                    plan.replacedScratch = target
                }
            }
            return plan
        }
    }

    /// The node and its persisted descendants, the node first.
    private func subtree(_ node: ViewNode) -> [ViewNode] {
        var result: [ViewNode] = []
        var frontier = [node]
        while let next = frontier.popLast() {
            guard next === node || !isScratch(next) else { continue }
            result.append(next)
            frontier += next.children.values.sorted { $0.storeID > $1.storeID }
        }
        return result
    }

    /// One move of a commit: its plan and where it goes.
    private struct MoveLeg {
        var plan: MovePlan
        var newName: FUSE.FileName
        var newText: String
        var to: ViewNode?
    }

    /// What the store answered for one leg.
    private typealias LegResults = (source: SaveResult?, destination: SaveResult, info: DocumentInfo?)

    /// Commits the legs (one move, or the two of an exchange) as one store transaction, then
    /// shows them. Each document changed is saved once, with every leg's changes to it.
    private func commit(_ legs: [MoveLeg], exchanging: Bool) throws(Errno) {
        var documents: [DocumentID: DocumentState] = [:]
        for leg in legs {
            documents[leg.plan.source.id] = leg.plan.source
            if let destination = leg.plan.destination { documents[destination.id] = destination }
        }
        // In id order, as every holder of several of these locks takes them.
        let locked = documents.values.sorted { $0.id < $1.id }
        for document in locked { document.saving.lock() }
        defer { for document in locked { document.saving.unlock() } }
        // The moved records, read under the lock; their ids are fixed except a new document's root.
        let moved = state.withLock { _ -> [(records: [NodeRecord], oldIDs: [StoreNodeID], base: VersionID)] in
            legs.map { leg in
                var newIDs: [ObjectIdentifier: StoreNodeID] = [:]
                for item in leg.plan.moved { newIDs[ObjectIdentifier(item.node)] = item.newID }
                var records: [NodeRecord] = []
                for (index, item) in leg.plan.moved.enumerated() {
                    var record =
                        item.node.linkOf.map { file -> NodeRecord in
                            var record = file.record
                            record.linkOf = newIDs[ObjectIdentifier(file)]
                            return record
                        } ?? item.node.record
                    record.id = item.newID
                    record.preferredName = nil
                    if index == 0 {
                        record.parent = leg.to?.persistAs
                        record.name = leg.newText
                    } else {
                        record.parent = item.node.parent.flatMap { newIDs[ObjectIdentifier($0)] }
                        record.name = item.node.name.string
                    }
                    records.append(record)
                }
                return (records, leg.plan.moved.map { $0.node.persistAs }, leg.plan.source.base)
            }
        }
        let results: [LegResults]
        do {
            results = try storeCall {
                try store.transaction(durable: false) { tx -> [LegResults] in
                    // Documents that go first, so that a document made under one of their
                    // names (an exchange with the root) finds it free.
                    for leg in legs where leg.plan.sourceChanges == nil {
                        try tx.deleteDocument(leg.plan.source.id, origin: origin)
                    }
                    for leg in legs {
                        if let replaced = leg.plan.replacedDocument {
                            try tx.deleteDocument(replaced.id, origin: origin)
                        }
                    }
                    var order: [DocumentID] = []
                    var merged: [DocumentID: DocumentChanges] = [:]
                    func merge(_ changes: DocumentChanges) {
                        guard var existing = merged[changes.document] else {
                            order.append(changes.document)
                            merged[changes.document] = changes
                            return
                        }
                        existing.nodes += changes.nodes
                        existing.removedNodes += changes.removedNodes
                        existing.contents.merge(changes.contents) { _, new in new }
                        merged[changes.document] = existing
                    }
                    for leg in legs { if let changes = leg.plan.sourceChanges { merge(changes) } }
                    var destinations: [DocumentID] = []
                    var created: [DocumentInfo?] = []
                    for (leg, (records, oldIDs, sourceBase)) in zip(legs, moved) {
                        var changes: DocumentChanges
                        var info: DocumentInfo?
                        if let prepared = leg.plan.destinationChanges {
                            changes = prepared
                        } else {
                            let made: DocumentInfo
                            (made, changes) = try createDocument(tx, like: records[0], named: leg.newText)
                            info = made
                        }
                        let rootID = info?.root
                        for (index, var record) in records.enumerated() {
                            record.document = changes.document
                            if index == 0, let rootID { record.id = rootID }
                            if let rootID, record.parent == records[0].id { record.parent = rootID }
                            if let rootID, record.linkOf == records[0].id { record.linkOf = rootID }
                            if record.kind == .regularFile && record.linkOf == nil {
                                // The bytes are shared: the store names the old node's, nothing is copied.
                                changes.contents[record.id] = .copy(
                                    of: NodeLookup(oldIDs[index], at: sourceBase))
                            }
                            changes.nodes.append(record)
                        }
                        merge(changes)
                        destinations.append(changes.document)
                        created.append(info)
                    }
                    var saved: [DocumentID: SaveResult] = [:]
                    for id in order {
                        guard let changes = merged[id] else { continue }
                        saved[id] = try tx.saveOnTop(changes)
                    }
                    return try zip(legs, zip(destinations, created)).map { leg, destination in
                        guard let result = saved[destination.0] else {
                            throw DocumentStoreError.invalidChange(
                                "a move saved nothing into its destination")
                        }
                        return (saved[leg.plan.source.id], result, destination.1)
                    }
                }
            }
        } catch {
            logger.error("moving \(legs[0].plan.source.info.name)/\(legs[0].plan.node.name) failed: \(error)")
            throw error
        }
        let notices = state.withLock { state -> [Notice] in
            var notices: [Notice] = []
            for (leg, (result, records)) in zip(legs, zip(results, moved.map(\.records))) {
                notices += show(
                    &state, leg.plan, results: result, records: records, newName: leg.newName,
                    newText: leg.newText, to: leg.to, exchanging: exchanging)
            }
            return notices
        }
        send(notices)
    }

    /// Puts the committed move into the view.
    private func show(
        _ state: inout State, _ plan: MovePlan, results: LegResults, records: [NodeRecord],
        newName: FUSE.FileName, newText: String, to: ViewNode?, exchanging: Bool
    ) -> [Notice] {
        var notices: [Notice] = []
        let node = plan.node
        let source = plan.source
        let version = results.destination.version.id
        // Out of the source.
        if node.atMountRoot {
            if state.rootEntries[node.name] === node { state.rootEntries[node.name] = nil }
            state.documents[source.id] = nil
            state.rootGeneration &+= 1
        } else {
            if let parent = node.parent, parent.children[node.name] === node {
                parent.children[node.name] = nil
            }
            if source.committed == nil { source.committed = [:] }
            for item in plan.moved { source.committed?[item.node.persistAs] = nil }
            if let changes = plan.sourceChanges, let result = results.source {
                for var record in changes.nodes {
                    record.version = result.version.id
                    source.committed?[record.id] = record
                }
                source.base = result.version.id
            }
            if let parent = node.parent, let record = source.committed?[parent.persistAs] {
                parent.record = record
            }
        }
        // Names that stay and named a moved file are a file of their own now.
        for (heir, file) in plan.copies {
            let others = file.aliases.values.filter {
                $0 !== heir && $0.parent != nil && !$0.isDescendant(of: node)
            }
            let copy = makeNode(
                storeID: heir.storeID, document: source.id,
                record: source.committed?[heir.persistAs] ?? file.record, name: heir.name)
            copy.persistAs = heir.persistAs
            copy.parent = heir.parent
            copy.record = file.record
            copy.record.id = heir.persistAs
            copy.record.parent = heir.parent?.persistAs
            copy.record.name = heir.name.string
            copy.record.linkOf = nil
            copy.contents?.reset(
                to: ContentBase(node: heir.persistAs, version: results.source?.version.id, size: file.size))
            heir.linked = false
            file.aliases[ObjectIdentifier(heir)] = nil
            notices.append(.inode(file.ino))
            heir.parent?.children[heir.name] = copy
            state.nodes[copy.ino] = copy
            for other in others {
                file.aliases[ObjectIdentifier(other)] = nil
                other.linkOf = copy
                copy.aliases[ObjectIdentifier(other)] = other
                if let parent = other.parent { notices.append(.entry(parent: parent.ino, name: other.name)) }
            }
            if let parent = copy.parent { notices.append(.entry(parent: parent.ino, name: copy.name)) }
        }
        // Into the destination.
        let destination: DocumentState
        if let existing = plan.destination {
            destination = existing
            // In an exchange the name's holder is the other leg's node, which moves, not goes.
            if let to, !exchanging {
                if let target = to.children[newName], target !== node { unlinkName(&state, target) }
            }
        } else {
            var info = results.info ?? source.info
            info.currentVersion = version
            destination = DocumentState(info: info, root: node)
            state.documents[info.id] = destination
            if let replaced = plan.replacedDocument {
                if state.rootEntries[replaced.root.name] === replaced.root { detach(&state, replaced.root) }
                state.documents[replaced.id] = nil
            }
            if let scratch = plan.replacedScratch, state.rootEntries[scratch.name] === scratch {
                detach(&state, scratch)
            }
            state.rootGeneration &+= 1
        }
        if destination.committed == nil { destination.committed = [:] }
        for (index, item) in plan.moved.enumerated() {
            var record = records[index]
            if index == 0, let info = results.info { record.id = info.root }
            record.document = destination.id
            if let info = results.info, record.parent == records[0].id { record.parent = info.root }
            if let info = results.info, record.linkOf == records[0].id { record.linkOf = info.root }
            record.version = version
            destination.committed?[record.id] = record
            let moved = item.node
            moved.persistAs = record.id
            moved.document = destination.id
            moved.record.document = destination.id
            moved.record.id = record.id
            if moved.linkOf == nil, let contents = moved.contents {
                contents.base = ContentBase(node: record.id, version: version, size: contents.base.size)
            }
            // A moved name of a file that stays is a file of its own: a new node for the kernel.
            if let file = moved.linkOf, !plan.moved.contains(where: { $0.node === file }) {
                file.aliases[ObjectIdentifier(moved)] = nil
                // Its link count: the kernel keeps it otherwise (with the writeback cache it
                // does not ask again after the rename).
                notices.append(.inode(file.ino))
                let copy = makeNode(
                    storeID: record.id, document: destination.id, record: record, name: moved.name)
                copy.record.linkOf = nil
                copy.parent = moved.parent
                moved.parent?.children[moved.name] = copy
                moved.linked = false
                state.nodes[copy.ino] = copy
                if let parent = moved.parent { notices.append(.entry(parent: parent.ino, name: moved.name)) }
            }
        }
        if let to {
            to.children[newName] = node
            node.parent = to
            node.atMountRoot = false
            node.name = newName
            node.record.name = newText
            node.record.parent = to.persistAs
            if let record = destination.committed?[to.persistAs] { to.record = record }
            node.reportedIno = nil
        } else {
            node.parent = nil
            node.atMountRoot = true
            node.name = newName
            node.record.name = newText
            node.record.parent = nil
            state.rootEntries[newName] = node
            state.rootChanged = .now
        }
        destination.base = version
        notices.append(.inode(node.ino))
        return notices
    }

}
