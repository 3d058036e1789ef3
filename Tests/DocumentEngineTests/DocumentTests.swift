import Foundation
import SQLiteStore
import TestSupport
import Testing

@testable import DocumentEngine

#if canImport(Glibc)
    import Glibc
#endif

/// A plain text document (flat file).
@MainActor
final class TextDocument: Document {
    var text = ""
    var loads = 0
    var updates = 0
    var errors: [String] = []
    var failContents = false
    /// When (on the document's clock) each save took its contents.
    var saveStarts: [Duration] = []
    var onContents: (() -> Void)?

    /// When set, a write waits for it first, off the main actor.
    nonisolated let writeGate = Locked<DispatchSemaphore?>(nil)

    nonisolated override func writeContents(
        _ contents: Any, andAttributes attributes: [AnyHashable: Any]?, safelyTo url: URL,
        for saveOperation: SaveOperation
    ) throws {
        writeGate.withLock { $0 }?.wait()
        try super.writeContents(contents, andAttributes: attributes, safelyTo: url, for: saveOperation)
    }

    override func contents(forType typeName: String) throws -> Any {
        if failContents { throw CocoaError(.fileWriteUnknown) }
        saveStarts.append(clock.now)
        onContents?()
        return Data(text.utf8)
    }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {
        guard let data = contents as? Data else { throw CocoaError(.fileReadCorruptFile) }
        text = String(decoding: data, as: UTF8.self)
        loads += 1
    }

    override func handleError(_ error: any Error, userInteractionPermitted: Bool) {
        errors.append(String(describing: error))
        super.handleError(error, userInteractionPermitted: userInteractionPermitted)
    }

    override func documentContentsDidUpdate() { updates += 1 }
}

/// An ImageNotes-style package: Text.txt + Image.png, keeping the wrapper it read.
@MainActor
final class NoteDocument: Document {
    var text = ""
    var image = Data()
    var wrapper: FileWrapper?

    override func contents(forType typeName: String) throws -> Any {
        let package = wrapper ?? FileWrapper(directoryWithFileWrappers: [:])
        if let old = package.fileWrappers?["Text.txt"], old.regularFileContents != Data(text.utf8) {
            package.removeFileWrapper(old)
        }
        if package.fileWrappers?["Text.txt"] == nil {
            package.addRegularFile(withContents: Data(text.utf8), preferredFilename: "Text.txt")
        }
        if let old = package.fileWrappers?["Image.png"], old.regularFileContents != image {
            package.removeFileWrapper(old)
        }
        if package.fileWrappers?["Image.png"] == nil {
            package.addRegularFile(withContents: image, preferredFilename: "Image.png")
        }
        wrapper = package
        return package
    }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {
        guard let package = contents as? FileWrapper else { throw CocoaError(.fileReadCorruptFile) }
        wrapper = package
        text =
            package.fileWrappers?["Text.txt"]?.regularFileContents.map { String(decoding: $0, as: UTF8.self) }
            ?? ""
        image = package.fileWrappers?["Image.png"]?.regularFileContents ?? Data()
    }
}

/// A document that must change type when it gains an image: RTF → RTFD (UD-4).
@MainActor
final class RichTextDocument: Document {
    var text = "{\\rtf1 hello}"
    var hasImage = false

    override var savingFileType: String? { hasImage ? "com.apple.rtfd" : fileType }

    override func contents(forType typeName: String) throws -> Any {
        if typeName == "com.apple.rtfd" {
            return FileWrapper(directoryWithFileWrappers: [
                "TXT.rtf": FileWrapper(regularFileWithContents: Data(text.utf8)),
                "image.png": FileWrapper(regularFileWithContents: Data([0x89, 0x50])),
            ])
        }
        return Data(text.utf8)
    }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {}
}

@MainActor
@Suite(.serialized) struct DocumentTests {
    let tmp: TemporaryDirectory

    init() throws {
        tmp = try TemporaryDirectory()
        // Conflict versions of documents on disk are kept under $XDG_STATE_HOME; keep them here.
        setenv("XDG_STATE_HOME", tmp.path("state"), 1)
    }

    @Test("UD-5/UD-6/UD-11: a new document is closed; open makes it normal and posts state changes")
    func openAndStates() async throws {
        let url = try tmp.write("note.txt", "hello")
        let doc = TextDocument(fileURL: url)
        #expect(doc.documentState == .closed)
        #expect(doc.fileModificationDate == nil)  // UD-3
        #expect(doc.localizedName == "note" && doc.fileType == "public.plain-text")  // UD-2
        let counter = Locked(0)
        let token = NotificationCenter.default.addObserver(
            forName: Document.stateChangedNotification, object: doc, queue: nil
        ) { _ in
            counter.withLock { $0 += 1 }
        }
        var posted: Int { counter.withLock { $0 } }
        defer { NotificationCenter.default.removeObserver(token) }
        var states = doc.stateChanges.makeAsyncIterator()
        #expect(await doc.open())
        #expect(doc.documentState == .normal)
        #expect(doc.text == "hello")
        let mtime = try FileFacts(url.path).mtime
        #expect(doc.fileModificationDate == mtime)
        #expect(await states.next() == .normal)
        #expect(posted == 1)
        #expect(await doc.open())  // already open: nothing happens, nothing posted
        #expect(posted == 1)
        #expect(await doc.close())
        #expect(doc.documentState == .closed)
        #expect(await doc.close() == false)  // UD-15: not open
    }

    @Test("UD-14/UD-9: a failed open calls handleError, sets savingError and stays closed")
    func failedOpen() async throws {
        let doc = TextDocument(fileURL: tmp.url("missing.txt"))
        #expect(await doc.open() == false)
        #expect(doc.documentState == [.closed, .savingError])
        #expect(doc.errors.count == 1)
    }

    @Test("UD-21/UD-26: save(.forCreating) writes a new document and opens it; overwriting replaces it")
    func saveCreatingAndOverwriting() async throws {
        let url = tmp.url("new.txt")
        let doc = TextDocument(fileURL: url)
        doc.text = "first"
        #expect(await doc.save(to: url, for: .forCreating))
        #expect(doc.documentState == .normal)
        #expect(try String(contentsOf: url, encoding: .utf8) == "first")
        doc.text = "second"
        doc.updateChangeCount(.done)
        #expect(doc.hasUnsavedChanges)
        #expect(await doc.save(to: url, for: .forOverwriting))
        #expect(!doc.hasUnsavedChanges)
        #expect(try String(contentsOf: url, encoding: .utf8) == "second")
        #expect(try tmp.entries().filter { $0.hasPrefix(".docfs-save") }.isEmpty)  // no scratch folder left
        await doc.close()
    }

    @Test("Safe-save: a failed save keeps the previous version, sets savingError and reports it")
    func failedSave() async throws {
        let url = try tmp.write("keep.txt", "precious")
        let doc = TextDocument(fileURL: url)
        #expect(await doc.open())
        doc.text = "new"
        doc.failContents = true
        #expect(await doc.save(to: url, for: .forOverwriting) == false)
        #expect(doc.documentState.contains(.savingError))
        #expect(doc.errors.count == 1)
        doc.failContents = false
        // A write failure (the folder became read-only) also leaves the old version intact.
        chmod(tmp.path, 0o500)
        defer { chmod(tmp.path, 0o700) }
        if geteuid() != 0 {  // root ignores permissions
            #expect(await doc.save(to: url, for: .forOverwriting) == false)
            #expect(doc.errors.count == 2)
        }
        chmod(tmp.path, 0o700)
        #expect(try String(contentsOf: url, encoding: .utf8) == "precious")
        await doc.close()
    }

    @Test("UD-28: change counting — done/undone, save then undo, and the unreachable saved state")
    func changeCounting() async throws {
        let doc = TextDocument(fileURL: try tmp.write("c.txt", "x"))
        #expect(await doc.open())
        doc.updateChangeCount(.done)
        #expect(doc.hasUnsavedChanges)
        doc.updateChangeCount(.undone)
        #expect(!doc.hasUnsavedChanges)  // (a)
        doc.updateChangeCount(.done)
        #expect(await doc.save(to: doc.fileURL, for: .forOverwriting))
        doc.updateChangeCount(.undone)
        #expect(doc.hasUnsavedChanges)
        doc.updateChangeCount(.redone)
        #expect(!doc.hasUnsavedChanges)  // (b)
        doc.updateChangeCount(.undone)
        doc.updateChangeCount(.done)  // a new change after undoing past the save
        #expect(doc.hasUnsavedChanges)
        doc.updateChangeCount(.undone)
        #expect(doc.hasUnsavedChanges)
        doc.updateChangeCount(.redone)
        #expect(doc.hasUnsavedChanges)  // (c): the saved state can never be reached again
        doc.updateChangeCount(.cleared)
        #expect(!doc.hasUnsavedChanges)
        await doc.close()
    }

    @Test("UD-29: an edit made while a save runs stays unsaved")
    func editDuringSave() async throws {
        let doc = TextDocument(fileURL: try tmp.write("t.txt", "x"))
        #expect(await doc.open())
        doc.text = "one"
        doc.updateChangeCount(.done)
        let token = doc.changeCountToken(for: .forOverwriting)
        doc.updateChangeCount(.done)  // the user types while the write is in flight
        doc.updateChangeCount(withToken: token, for: .forOverwriting)
        #expect(doc.hasUnsavedChanges)
        // Through the real save path: an edit lands while the write runs off the main actor.
        doc.onContents = { Task { @MainActor in doc.updateChangeCount(.done) } }
        #expect(await doc.save(to: doc.fileURL, for: .forOverwriting))
        #expect(doc.hasUnsavedChanges)
        doc.onContents = nil
        #expect(await doc.save(to: doc.fileURL, for: .forOverwriting))
        #expect(!doc.hasUnsavedChanges)
        await doc.close()
    }

    /// A document of `name` ("v0" on disk) on a manual clock, opened and edited to "v1", once
    /// its autosave timer waits on the clock.
    func editedOnManualClock(_ name: String) async throws -> (ManualClock, URL, TextDocument) {
        let clock = ManualClock()
        let url = try tmp.write(name, "v0")
        let doc = TextDocument(fileURL: url)
        doc.clock = DocumentClock(clock)
        doc.monitoringInterval = .seconds(3600)
        #expect(await doc.open())
        doc.text = "v1"
        doc.updateChangeCount(.done)
        #expect(await eventually { clock.sleeperCount >= 2 })  // the monitor and the autosave timer
        return (clock, url, doc)
    }

    @Test("UD-31: autosave after 15 s of quiet, and edits cannot postpone it past 300 s")
    func autosaveTiming() async throws {
        let (clock, url, doc) = try await editedOnManualClock("auto.txt")
        clock.advance(by: .seconds(14))
        try await Task.sleep(for: .milliseconds(20))
        #expect(try String(contentsOf: url, encoding: .utf8) == "v0")
        clock.advance(by: .seconds(1))
        #expect(await eventually { !doc.hasUnsavedChanges })
        #expect(try String(contentsOf: url, encoding: .utf8) == "v1")

        // Continuous typing, one edit every 10 s: no 15 s quiet period ever comes, yet the next
        // save starts no later than 300 s after the first unsaved change.
        let firstEdit = doc.clock.now
        let startsBefore = doc.saveStarts.count
        var edit = 2
        while doc.saveStarts.count == startsBefore && doc.clock.now - firstEdit < .seconds(400) {
            doc.text = "v\(edit)"
            doc.updateChangeCount(.done)
            edit += 1
            // The change monitor sleeps on this clock too: wait for the new autosave timer as well.
            #expect(await eventually { clock.sleeperCount >= 2 })
            clock.advance(by: .seconds(10))
            _ = await eventually(within: .milliseconds(50)) { doc.saveStarts.count > startsBefore }
        }
        let started = try #require(doc.saveStarts.last)
        #expect(doc.saveStarts.count == startsBefore + 1)
        #expect(started - firstEdit <= .seconds(300))
        #expect(started - firstEdit > .seconds(15))  // it did wait while the edits continued
        // The save runs on real time: give a loaded machine room (it returns as soon as it holds).
        #expect(
            await eventually(within: .seconds(30)) { (try? String(contentsOf: url, encoding: .utf8)) != "v1" }
        )
        await doc.close()
    }

    @Test("UD-31: an autosave that comes due while a save writes finds the changes saved and writes nothing")
    func autosaveDuringSave() async throws {
        let (clock, url, doc) = try await editedOnManualClock("during.txt")
        let gate = DispatchSemaphore(value: 0)
        doc.writeGate.withLock { $0 = gate }
        let save = Task { await doc.save(to: url, for: .forOverwriting) }
        #expect(await eventually { doc.saveStarts.count == 1 })  // contents taken; the write waits
        clock.advance(by: .seconds(15))  // the autosave comes due meanwhile
        try await Task.sleep(for: .milliseconds(50))
        doc.writeGate.withLock { $0 = nil }
        gate.signal()
        #expect(await save.value)
        #expect(await eventually { !doc.hasPendingAutosave })
        try await Task.sleep(for: .milliseconds(50))
        #expect(doc.saveStarts.count == 1)
        #expect(!doc.hasUnsavedChanges)
        #expect(try String(contentsOf: url, encoding: .utf8) == "v1")
        await doc.close()
    }

    @Test("UD-15: close saves pending changes")
    func closeSaves() async throws {
        let url = try tmp.write("close.txt", "old")
        let doc = TextDocument(fileURL: url)
        #expect(await doc.open())
        doc.text = "saved by close"
        doc.updateChangeCount(.done)
        #expect(await doc.close())
        #expect(try String(contentsOf: url, encoding: .utf8) == "saved by close")
    }

    @Test("UD-16/UD-7: revert reloads, clears changes, and disables editing meanwhile")
    func revert() async throws {
        let url = try tmp.write("r.txt", "disk")
        let doc = TextDocument(fileURL: url)
        #expect(await doc.open())
        doc.text = "unsaved"
        doc.updateChangeCount(.done)
        var states = doc.stateChanges.makeAsyncIterator()
        #expect(await doc.revert(toContentsOf: url))
        #expect(await states.next() == .editingDisabled)
        #expect(await states.next() == .normal)
        #expect(doc.text == "disk" && !doc.hasUnsavedChanges)
        await doc.close()
    }

    @Test("Package documents save only the wrappers that changed (W-6 through safe-save)")
    func packageIncremental() async throws {
        let url = tmp.url("Note.imagenote")
        let doc = NoteDocument(fileURL: url)
        doc.text = "milk"
        doc.image = sampleBytes(100_000, seed: 1)
        #expect(await doc.save(to: url, for: .forCreating))
        let imageInode = try FileFacts(url.appendingPathComponent("Image.png").path).inode
        await doc.close()

        let reopened = NoteDocument(fileURL: url)
        #expect(await reopened.open())
        #expect(reopened.text == "milk" && reopened.image == sampleBytes(100_000, seed: 1))
        reopened.text = "eggs"
        reopened.updateChangeCount(.done)
        #expect(await reopened.save(to: url, for: .forOverwriting))
        #expect(try FileFacts(url.appendingPathComponent("Image.png").path).inode == imageInode)
        #expect(try String(contentsOf: url.appendingPathComponent("Text.txt"), encoding: .utf8) == "eggs")
        await reopened.close()
    }

    @Test("UD-4/UD-22: a document that must change type is saved under the new extension, as a move")
    func savingFileType() async throws {
        let url = try tmp.write("Letter.rtf", "{\\rtf1 hello}")
        let doc = RichTextDocument(fileURL: url)
        #expect(await doc.open())
        doc.hasImage = true
        doc.updateChangeCount(.done)
        #expect(await doc.save(to: url, for: .forOverwriting))
        #expect(doc.fileURL.lastPathComponent == "Letter.rtfd")
        #expect(doc.fileType == "com.apple.rtfd")
        #expect(!FileManager.default.fileExists(atPath: url.path))  // moved, not copied
        #expect(FileManager.default.fileExists(atPath: tmp.path("Letter.rtfd")))
        #expect(try tmp.entries("Letter.rtfd") == ["TXT.rtf", "image.png"])
        await doc.close()
    }

    @Test("Another process's change reloads a clean document and tells observers")
    func externalChangeReloads() async throws {
        let url = try tmp.write("shared.txt", "v1")
        let doc = TextDocument(fileURL: url)
        doc.monitoringInterval = .seconds(3600)
        #expect(await doc.open())
        var updates = doc.contentsUpdates.makeAsyncIterator()
        #expect(await doc.checkForExternalChanges() == false)
        try tmp.write("shared.txt", "v2 from another process")
        #expect(await doc.checkForExternalChanges())
        #expect(doc.text == "v2 from another process")
        #expect(doc.updates == 1 && doc.loads == 2)
        #expect(await updates.next() != nil)
        #expect(doc.documentState == .normal)
        await doc.close()
    }

    @Test("FV-1..FV-5: a change by another process while editing keeps both versions and is resolvable")
    func externalChangeConflict() async throws {
        let url = try tmp.write("c.txt", "base")
        let doc = TextDocument(fileURL: url)
        doc.monitoringInterval = .seconds(3600)
        #expect(await doc.open())
        doc.text = "mine"
        doc.updateChangeCount(.done)
        try tmp.write("c.txt", "theirs")
        #expect(await doc.checkForExternalChanges())
        #expect(doc.documentState.contains(.inConflict))
        #expect(doc.text == "theirs")  // the newer save is current, as iCloud decides
        let conflicts = await doc.unresolvedConflictVersions()
        #expect(conflicts.count == 1)
        let mine = try #require(conflicts.first)
        #expect(try mine.fileWrapper().regularFileContents == Data("mine".utf8))
        #expect(DocumentVersion.unresolvedConflictVersionsOfItem(at: url).count == 1)

        // The user keeps their version: replace, resolve, remove the rest (FV-5).
        try mine.replaceItem(at: url)
        try mine.resolve()
        #expect(mine.isResolved)
        try DocumentVersion.removeOtherVersionsOfItem(at: url)
        #expect(DocumentVersion.otherVersionsOfItem(at: url).isEmpty)
        #expect(await doc.revert(toContentsOf: url))
        await doc.updateConflictState()
        #expect(!doc.documentState.contains(.inConflict))
        #expect(doc.text == "mine")
        await doc.close()
    }

    @Test("Documents in a store open, save incrementally, and see other writers' saves")
    func storeDocuments() async throws {
        let store = try SQLiteStore(path: tmp.path("Docs.docstore"), options: .create)
        let doc = NoteDocument(store: store, name: "Trip.imagenote")
        #expect(doc.fileURL.path == tmp.path("Docs.docstore") + "/Trip.imagenote")
        doc.text = "pack"
        doc.image = sampleBytes(300_000, seed: 5)
        #expect(await doc.save(to: doc.fileURL, for: .forCreating))
        let info = try #require(try store.document(named: "Trip.imagenote"))
        #expect(info.kind == .package)
        let written = store.statistics.bytesWritten
        doc.text = "pack light"
        doc.updateChangeCount(.done)
        #expect(await doc.save(to: doc.fileURL, for: .forOverwriting))
        #expect(store.statistics.bytesWritten - written == Int64("pack light".utf8.count))  // the image was not rewritten
        await doc.close()

        // Another process (a second connection) opens it, and sees the first one's next save.
        let other = try SQLiteStore(path: store.path)
        let second = NoteDocument(store: other, name: "Trip.imagenote")
        second.monitoringInterval = .seconds(3600)
        #expect(await second.open())
        #expect(second.text == "pack light" && second.image == sampleBytes(300_000, seed: 5))
        let first = NoteDocument(store: store, name: "Trip.imagenote")
        #expect(await first.open())
        first.text = "changed elsewhere"
        first.updateChangeCount(.done)
        #expect(await first.save(to: first.fileURL, for: .forOverwriting))
        #expect(await second.checkForExternalChanges())
        #expect(second.text == "changed elsewhere")

        // Both edit: the store keeps both; the second sees the conflict.
        first.text = "first's edit"
        first.updateChangeCount(.done)
        #expect(await first.save(to: first.fileURL, for: .forOverwriting))
        second.text = "second's edit"
        second.updateChangeCount(.done)
        #expect(await second.checkForExternalChanges())
        #expect(second.documentState.contains(.inConflict))
        let conflicts = await second.unresolvedConflictVersions()
        #expect(conflicts.count == 1)
        let theirs = try #require(conflicts.first).fileWrapper()
        #expect(theirs.fileWrappers?["Text.txt"]?.regularFileContents == Data("second's edit".utf8))
        await first.close()
        await second.close()
    }

    @Test("FC-1/FC-2: a writer excludes readers across processes; items in a package lock the package")
    func coordination() async throws {
        try tmp.write("Doc.pkg/inner.txt", "x")
        let package = tmp.url("Doc.pkg")
        #expect(
            FileCoordinator.coordinatedItem(for: tmp.url("Doc.pkg/inner.txt")) == package.standardizedFileURL)
        // Another process holds the package's write lock for 300 ms (flock(1) on the same lock file).
        let lockFile = tmp.path(".Doc.pkg.docfs-lock")
        #expect(FileManager.default.createFile(atPath: lockFile, contents: nil))
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/usr/bin/flock")
        holder.arguments = ["-x", lockFile, "-c", "echo locked; sleep 0.3"]
        let pipe = Pipe()
        holder.standardOutput = pipe
        try holder.run()
        _ = pipe.fileHandleForReading.availableData  // wait until it holds the lock
        let start = ContinuousClock.now
        let text = try await Task.detached {
            try FileCoordinator().coordinate(readingItemAt: package.appendingPathComponent("inner.txt")) {
                url in
                try String(contentsOf: url, encoding: .utf8)
            }
        }.value
        let waited = ContinuousClock.now - start
        holder.waitUntilExit()
        #expect(text == "x")
        #expect(waited >= .milliseconds(150), "the read did not wait for the writer (\(waited))")
    }

    @Test(
        "saveAllOpenDocuments saves every open document with changes (the SIGTERM helper's work); in a task group of open documents, only those"
    )
    func saveAll() async throws {
        let other = TextDocument(fileURL: try tmp.write("other.txt", "c"))
        #expect(await other.open())
        other.text = "c2"
        other.updateChangeCount(.done)
        // In a group of its own: "every open document" is every one in the process, and other
        // tests running beside this one have documents open with changes they mean to keep.
        try await OpenDocuments.$group.withValue("saveAll") {
            let a = TextDocument(fileURL: try tmp.write("a.txt", "a"))
            let b = TextDocument(fileURL: try tmp.write("b.txt", "b"))
            #expect(await a.open())
            #expect(await b.open())
            a.text = "a2"
            a.updateChangeCount(.done)
            b.text = "b2"
            b.updateChangeCount(.done)
            await Document.saveAllOpenDocuments()
            #expect(try String(contentsOf: a.fileURL, encoding: .utf8) == "a2")
            #expect(try String(contentsOf: b.fileURL, encoding: .utf8) == "b2")
            await a.close()
            await b.close()
        }
        // A document opened outside the group kept its changes unsaved.
        #expect(other.hasUnsavedChanges)
        #expect(try String(contentsOf: other.fileURL, encoding: .utf8) == "c")
        await other.close()
    }
}

@Suite struct AutosaveScheduleTests {
    @Test("UD-31: the delay shrinks as the 300 s maximum since the last save approaches")
    func delays() {
        var schedule = AutosaveSchedule()
        schedule.noteFirstChange(at: .seconds(0))
        #expect(schedule.delay(now: .seconds(1), pending: false) == .seconds(15))
        #expect(schedule.delay(now: .seconds(100), pending: true) == .seconds(15))  // 200 s left
        #expect(schedule.delay(now: .seconds(160), pending: true) == .seconds(7.5))  // 140 s left
        #expect(schedule.delay(now: .seconds(240), pending: true) == .milliseconds(1875))  // 60 s left
        #expect(schedule.delay(now: .seconds(299), pending: true) == .seconds(1))  // what remains
        #expect(schedule.delay(now: .seconds(301), pending: true) == .zero)
    }
}

/// UD-30: the undo manager drives change counting.
@MainActor
@Suite struct DocumentUndoTests {
    @Test("UD-30: registered undo makes the document dirty; undo cleans it; redo dirties it")
    func undoCounting() async throws {
        let tmp = try TemporaryDirectory()
        let doc = TextDocument(fileURL: try tmp.write("u.txt", "a"))
        doc.monitoringInterval = .seconds(3600)
        #expect(await doc.open())
        let manager = try #require(doc.undoManager)
        #expect(doc.undoManager === manager)  // created once
        func setText(_ new: String) {
            let old = doc.text
            doc.text = new
            manager.registerUndo(withTarget: doc) { target in setTextUndoable(target, old, manager) }
        }
        setText("ab")
        manager.endEventGrouping()  // what the main queue's next turn does
        #expect(doc.hasUnsavedChanges)
        manager.undo()
        #expect(doc.text == "a" && !doc.hasUnsavedChanges)
        manager.redo()
        #expect(doc.text == "ab" && doc.hasUnsavedChanges)

        // An explicit group inside the implicit event group counts once.
        #expect(await doc.save(to: doc.fileURL, for: .forOverwriting))
        #expect(!doc.hasUnsavedChanges)
        manager.beginUndoGrouping()
        setText("abc")
        setText("abcd")
        manager.endUndoGrouping()
        manager.endEventGrouping()
        manager.undo()
        #expect(doc.text == "ab" && !doc.hasUnsavedChanges)

        // A save closes the open group first, so its edit counts as saved (UD-21).
        setText("saved")
        #expect(await doc.save(to: doc.fileURL, for: .forOverwriting))
        #expect(!doc.hasUnsavedChanges)
        #expect(manager.canUndo)

        // A revert removes the undo history (UD-16).
        #expect(await doc.revert(toContentsOf: doc.fileURL))
        #expect(!manager.canUndo && !manager.canRedo)
        await doc.close()
    }
}

@MainActor
private func setTextUndoable(_ doc: TextDocument, _ text: String, _ manager: UndoManager) {
    let old = doc.text
    doc.text = text
    manager.registerUndo(withTarget: doc) { target in setTextUndoable(target, old, manager) }
}

/// The seeds' open-or-create convenience and the shutdown path.
@MainActor
@Suite struct DocumentLifecycleTests {
    @Test("documentAtURL creates a missing document and opens an existing one")
    func openOrCreate() async throws {
        let tmp = try TemporaryDirectory()
        let url = tmp.url("Things.txt")
        let created = try #require(await TextDocument.documentAtURL(url))
        #expect(FileManager.default.fileExists(atPath: url.path))
        #expect(created.documentState == .normal)
        created.text = "kept"
        created.updateChangeCount(.done)
        await created.close()
        let opened = try #require(await TextDocument.documentAtURL(url))
        #expect(opened.text == "kept" && opened.loads == 1)
        await opened.close()

        let store = try SQLiteStore(path: tmp.path("S.docstore"), options: .create)
        let inStore = try #require(await TextDocument.document(named: "n.txt", in: store))
        #expect(try store.document(named: "n.txt") != nil)
        await inStore.close()
    }
}
