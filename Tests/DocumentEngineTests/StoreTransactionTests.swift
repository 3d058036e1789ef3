import DocumentEngine
import Foundation
import StoreTestSupport
import TestSupport
import Testing

/// The operations a ``DocumentStore/transaction(durable:_:)`` offers, on every backend: each does
/// what the store's method of the same name does, later ones see earlier ones, and all of them
/// commit together or not at all. A mount commits each system call as one such transaction.
@Suite struct StoreTransactionTests {
    let fixture: StoreFixture
    var store: any DocumentStore { fixture.store }

    init(_ kind: StoreKind = .sqlite) throws {
        fixture = try StoreFixture(kind, chunkSize: 64 * 1024)
    }

    struct Abandoned: Error {}

    func flat(_ name: String, _ text: String) throws -> DocumentInfo {
        let info = try store.createDocument(
            named: name, kind: .flat, type: nil, permissions: nil, origin: "test")
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.contents[info.root] = .replace(DataContentsSource(Data(text.utf8)))
        _ = try store.save(changes)
        return try store.document(info.id)
    }

    func text(of document: DocumentInfo) throws -> String {
        let current = try store.document(document.id)
        let size = try #require(try store.node(current.root)).size
        return String(
            decoding: try store.readContents(of: current.root, at: nil, offset: 0, count: Int(size)),
            as: UTF8.self)
    }

    @Test(
        "Replacing a document by renaming another onto its name is one transaction: the name always has one of them",
        arguments: StoreKind.everyBackend)
    static func replacingRename(_ kind: StoreKind) throws { try Self(kind).replacingRename() }
    func replacingRename() throws {
        let old = try flat("report.txt", "old")
        let new = try flat("report.txt.tmp-1", "new")
        let before = try store.latestEventSequence()
        let renamed = try store.transaction(durable: false) { tx -> DocumentInfo in
            try tx.deleteDocument(old.id, origin: "test")
            #expect(try tx.document(named: "report.txt") == nil)
            let renamed = try tx.renameDocument(new.id, to: "report.txt")
            #expect(try tx.document(named: "report.txt")?.id == new.id)
            return renamed
        }
        #expect(renamed.id == new.id && renamed.name == "report.txt")
        #expect(try store.document(named: "report.txt")?.id == new.id)
        #expect(try store.document(named: "report.txt.tmp-1") == nil)
        #expect(try text(of: renamed) == "new")
        #expect(try store.deletedDocuments().map(\.id) == [old.id])
        let events = try store.events(after: before).map { "\($0.kind) \($0.document.rawValue) \($0.name)" }
        #expect(events == ["deleted \(old.id.rawValue) report.txt", "renamed \(new.id.rawValue) report.txt"])
    }

    @Test(
        "A transaction that throws changes nothing: no deletion, no rename, no new document",
        arguments: StoreKind.everyBackend)
    static func rollback(_ kind: StoreKind) throws { try Self(kind).rollback() }
    func rollback() throws {
        let old = try flat("a.txt", "a")
        let new = try flat("b.txt", "b")
        let before = try store.latestEventSequence()
        #expect(throws: Abandoned.self) {
            try store.transaction(durable: true) { tx in
                try tx.deleteDocument(old.id, origin: "test")
                _ = try tx.renameDocument(new.id, to: "a.txt")
                _ = try tx.createDocument(
                    named: "c.txt", root: DocumentRoot(kind: .regularFile), type: nil, origin: "test")
                throw Abandoned()
            }
        }
        #expect(try store.documents().map(\.name) == ["a.txt", "b.txt"])
        #expect(try text(of: old) == "a" && text(of: new) == "b")
        #expect(try store.deletedDocuments().isEmpty)
        #expect(try store.events(after: before).isEmpty)
    }

    @Test(
        "A rename onto a live document's name fails, and the transaction with it",
        arguments: StoreKind.everyBackend)
    static func renameOntoTakenName(_ kind: StoreKind) throws { try Self(kind).renameOntoTakenName() }
    func renameOntoTakenName() throws {
        _ = try flat("a.txt", "a")
        let b = try flat("b.txt", "b")
        #expect(throws: DocumentStoreError.documentExists("a.txt")) {
            try store.transaction(durable: false) { tx in _ = try tx.renameDocument(b.id, to: "a.txt") }
        }
        #expect(throws: DocumentStoreError.self) {
            try store.transaction(durable: false) { tx in _ = try tx.renameDocument(b.id, to: "x/y") }
        }
        #expect(try store.documents().map(\.name) == ["a.txt", "b.txt"])
    }

    @Test("Exchanging two documents swaps their names in one transaction", arguments: StoreKind.everyBackend)
    static func exchange(_ kind: StoreKind) throws { try Self(kind).exchange() }
    func exchange() throws {
        let a = try flat("a.txt", "a")
        let b = try store.createDocument(
            named: "b.pkg", kind: .package, type: nil, permissions: nil, origin: "test")
        let before = try store.latestEventSequence()
        let (first, second) = try store.transaction(durable: false) { tx in
            try tx.exchangeDocuments(a.id, b.id)
        }
        #expect(first.id == a.id && first.name == "b.pkg")
        #expect(second.id == b.id && second.name == "a.txt")
        #expect(try store.document(named: "b.pkg")?.id == a.id)
        #expect(try store.document(named: "a.txt")?.id == b.id)
        #expect(try text(of: first) == "a")
        let events = try store.events(after: before).map { "\($0.kind) \($0.document.rawValue) \($0.name)" }
        #expect(events == ["renamed \(a.id.rawValue) b.pkg", "renamed \(b.id.rawValue) a.txt"])
        // A deleted document has no name to trade.
        try store.deleteDocument(b.id, origin: "test")
        #expect(throws: DocumentStoreError.self) {
            try store.transaction(durable: false) { tx in _ = try tx.exchangeDocuments(a.id, b.id) }
        }
        #expect(try store.document(a.id).name == "b.pkg")
    }

    @Test(
        "A new document, its owner and its first contents are one transaction; its root record is read inside it",
        arguments: StoreKind.everyBackend)
    static func createWithContents(_ kind: StoreKind) throws { try Self(kind).createWithContents() }
    func createWithContents() throws {
        let (info, saved) = try store.transaction(durable: false) { tx -> (DocumentInfo, SaveResult) in
            let info = try tx.createDocument(
                named: "new.txt",
                root: DocumentRoot(kind: .regularFile, permissions: 0o600, uid: 4242, gid: 4343),
                type: nil, origin: "test")
            let root = try #require(try tx.node(info.root))
            #expect(root.uid == 4242 && root.gid == 4343 && root.permissions == 0o600)
            var changes = DocumentChanges(document: info.id, base: info.currentVersion)
            changes.contents[info.root] = .replace(DataContentsSource(Data("first".utf8)))
            return (info, try tx.save(changes))
        }
        #expect(try store.document(info.id).currentVersion == saved.version.id)
        #expect(try text(of: info) == "first")
        let root = try #require(try store.node(info.root))
        #expect(root.uid == 4242 && root.gid == 4343)
        #expect(throws: Abandoned.self) {
            try store.transaction(durable: false) { tx in
                let other = try tx.createDocument(
                    named: "other.txt", root: DocumentRoot(kind: .regularFile), type: nil, origin: "test")
                var changes = DocumentChanges(document: other.id, base: other.currentVersion)
                changes.contents[other.root] = .replace(DataContentsSource(Data("x".utf8)))
                _ = try tx.save(changes)
                throw Abandoned()
            }
        }
        #expect(try store.document(named: "other.txt") == nil)
    }

    @Test(
        "Keeping a conflict version: a save, the restore of the conflict and its resolution in one transaction",
        arguments: StoreKind.everyBackend)
    static func restoreAndResolve(_ kind: StoreKind) throws { try Self(kind).restoreAndResolve() }
    func restoreAndResolve() throws {
        let doc = try flat("c.txt", "base")
        let base = doc.currentVersion
        var theirs = DocumentChanges(document: doc.id, base: base)
        theirs.contents[doc.root] = .replace(DataContentsSource(Data("theirs".utf8)))
        _ = try store.save(theirs)
        var mine = DocumentChanges(document: doc.id, base: base)
        mine.contents[doc.root] = .replace(DataContentsSource(Data("mine".utf8)))
        let conflict = try store.save(mine)
        #expect(conflict.isConflict)
        // A throwing body leaves the conflict unresolved and the current version as it was.
        #expect(throws: Abandoned.self) {
            try store.transaction(durable: false) { tx in
                _ = try tx.restore(conflict.version.id, of: doc.id, origin: "test")
                try tx.resolveConflict(conflict.version.id)
                throw Abandoned()
            }
        }
        #expect(try text(of: doc) == "theirs")
        #expect(try store.unresolvedConflicts().map(\.id) == [conflict.version.id])
        let restored = try store.transaction(durable: false) { tx -> SaveResult in
            let restored = try tx.restore(conflict.version.id, of: doc.id, origin: "test")
            try tx.resolveConflict(conflict.version.id)
            return restored
        }
        #expect(!restored.isConflict)
        #expect(try text(of: doc) == "mine")
        #expect(try store.unresolvedConflicts().isEmpty)
    }
}
