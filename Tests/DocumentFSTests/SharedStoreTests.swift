import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A flat text document, as an app would open it from the store.
@MainActor
final class AppTextDocument: Document {
    var text = ""
    var reloads = 0

    override func contents(forType typeName: String) throws -> Any { Data(text.utf8) }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {
        guard let data = contents as? Data else { throw CocoaError(.fileReadCorruptFile) }
        text = String(decoding: data, as: UTF8.self)
    }

    override func documentContentsDidUpdate() { reloads += 1 }
}

/// A package document whose model is the text of its `notes.txt`.
@MainActor
final class AppPackageDocument: Document {
    var notes = ""
    var wrapper: FileWrapper?

    override func contents(forType typeName: String) throws -> Any {
        let package = wrapper ?? FileWrapper(directoryWithFileWrappers: [:])
        if let old = package.fileWrappers?["notes.txt"] { package.removeFileWrapper(old) }
        package.addRegularFile(withContents: Data(notes.utf8), preferredFilename: "notes.txt")
        wrapper = package
        return package
    }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {
        guard let package = contents as? FileWrapper else { throw CocoaError(.fileReadCorruptFile) }
        wrapper = package
        notes =
            package.fileWrappers?["notes.txt"]?.regularFileContents.map {
                String(decoding: $0, as: UTF8.self)
            } ?? ""
    }
}

/// The mount and apps share one store: another process's saves show up in the mount (within a
/// second: `scripts/bench.sh` B8 measures it), and writes through the mount reach an app's open `Document` (reload when it is clean,
/// a conflict when it has unsaved changes).
@MainActor
@Suite(.serialized)
struct SharedStoreTests {
    @Test(
        "saves by another store connection show up in the mount (invalidated, not timed out), also over our own writes",
        arguments: StoreKind.all)
    func otherWritersShowUp(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store, configure: kernelCachesForAMinute) { mount in
            let notes = mount.url("Work.pkg/notes.txt")
            let flat = mount.url("Flat.txt")
            // Our own write first, saved and cached by the kernel.
            try await offThread {
                try writeText(notes, "ours\n")
                #expect(try readText(notes) == "ours\n")
                #expect(try readText(flat) == Fixture.flatText)
            }
            // The close returned before the committer's save: a save by another process based
            // on the version before it would be a conflict, kept beside ours, not shown.
            let other = try Engine(fixture)
            try await expectEventually("our write saved") {
                try other.text("Work.pkg", "notes.txt") == "ours\n"
            }
            // Another process saves both documents.
            try other.replaceText("Work.pkg", "notes.txt", with: "theirs, longer\n")
            let flatInfo = try other.document("Flat.txt")
            var flatChanges = DocumentChanges(document: flatInfo.id, base: flatInfo.currentVersion)
            flatChanges.contents = [flatInfo.root: .replace(DataContentsSource(Data("app text\n".utf8)))]
            flatChanges.origin = "another process"
            _ = try other.store.save(flatChanges)

            let waited = try await offThread { () -> [Double?] in
                [
                    eventually(timeout: 10) { try readText(notes) == "theirs, longer\n" },
                    eventually(timeout: 10) { try readText(flat) == "app text\n" },
                ]
            }
            for (index, seconds) in waited.enumerated() {
                #expect(seconds != nil, "change \(index) never showed up")
            }
            // And we can write on top of theirs.
            try await offThread {
                let fd = try openFile(notes, O_WRONLY | O_APPEND)
                try writeAll(fd, "and ours\n")
                try sys(close(fd), "close")
            }
            try await expectEventually("our write on top of theirs") {
                try other.text("Work.pkg", "notes.txt") == "theirs, longer\nand ours\n"
            }
        }
    }

    @Test(
        "a mount's save and another process's save of one document: disjoint changes both apply, a clash keeps both",
        arguments: StoreKind.all)
    func concurrentSaves(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        let other = try Engine(fixture)
        /// Another process replaces one wrapper's contents.
        func otherSaves(_ path: String, _ text: String) throws {
            try other.replaceText("Work.pkg", path, with: text)
        }
        // The mount's changes must stay unsaved until the closes: a quiet-interval save in
        // between (a busy machine can take a second between two steps) would put the other
        // process's save on top of the mount's, and there would be no clash to see.
        try await withMount(fixture.store, configure: { $0.fileSystem.quietInterval = .seconds(60) }) {
            mount in
            let notes = mount.url("Work.pkg/notes.txt")
            // Disjoint: the mount changes notes.txt while the other process saves sub/inner.txt.
            // (The writers are child processes: see FileHolder.)
            let appender = try await offThread { try FileHolder(notes, flags: "O_WRONLY|O_APPEND") }
            defer { appender.stop() }
            try await offThread { try appender.send("write mount") }
            try otherSaves("sub/inner.txt", "other\n")
            try await offThread { try appender.send("close") }
            try await expectEventually("the mount's save on top") {
                try other.text("Work.pkg", "notes.txt") == Fixture.notesText + "mount"
            }
            #expect(try other.text("Work.pkg", "sub/inner.txt") == "other\n")

            // The same wrapper: nothing is lost; one of the two is a conflict version.
            let writer = try await offThread { try FileHolder(notes, flags: "O_WRONLY|O_TRUNC") }
            defer { writer.stop() }
            try await offThread { try writer.send("write mount's version") }
            try otherSaves("notes.txt", "other's version")
            try await offThread { try writer.send("close") }
            let work = try other.document("Work.pkg")
            try await expectEventually("the mount's save of the same wrapper") {
                try other.store.versions(of: work.id).contains { $0.isConflict }
            }
            let versions = try other.store.versions(of: work.id)
            let texts = try versions.map { try other.text(of: work.id, "notes.txt", at: $0.id) }
            #expect(texts.contains("mount's version"), "\(texts)")
            #expect(texts.contains("other's version"), "\(texts)")
            #expect(versions.contains { $0.isConflict })
            // The mount shows the store's current version.
            let current = try other.text("Work.pkg", "notes.txt")
            let shown = try await waitUntil(timeout: 3) { try readText(notes) == current }
            #expect(shown != nil, "the mount does not show the current \(String(describing: current))")
        }
    }

    @Test(
        "two mounts adding files to one package at once: both saves apply, no conflict (the folder's times merge)",
        arguments: StoreKind.all)
    func twoMountsAddToOnePackage(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        let other = try Engine(fixture)
        let slow: (inout DocumentFSMount.Options) -> Void = { $0.fileSystem.quietInterval = .seconds(60) }
        try await withMount(fixture.store, configure: slow) { first in
            try await withMount(try fixture.reopen(), configure: slow) { second in
                let before = try other.versions("Work.pkg").count
                // The second mount's new file stays open with its bytes, unsaved, while the
                // first mount's is made and saved: the second saves on a base older than that.
                let held = try await offThread {
                    try FileHolder(second.url("Work.pkg/second.txt"), flags: "O_WRONLY|O_CREAT")
                }
                defer { held.stop() }
                try await offThread { try held.send("write from the second mount") }
                try await offThread { try writeText(first.url("Work.pkg/first.txt"), "from the first mount") }
                try await expectEventually("the first mount's save", timeout: 10) {
                    try other.text("Work.pkg", "first.txt") == "from the first mount"
                }
                try await offThread { try held.send("close") }
                try await expectEventually("the second mount's save", timeout: 10) {
                    try other.text("Work.pkg", "second.txt") == "from the second mount"
                }
                #expect(try other.text("Work.pkg", "first.txt") == "from the first mount")
                let versions = try other.versions("Work.pkg")
                #expect(versions.count > before)
                #expect(!versions.contains { $0.isConflict }, "\(versions)")
                // Each mount shows both files.
                for mount in [first, second] {
                    let shown = try await offThread {
                        eventually(timeout: 10) {
                            try entries(in: mount.url("Work.pkg")).contains("first.txt")
                                && entries(in: mount.url("Work.pkg")).contains("second.txt")
                        }
                    }
                    #expect(shown != nil, "\((try? entries(in: mount.url("Work.pkg"))) ?? [])")
                }
            }
        }
    }

    @Test(
        "scratch files kept through a reload of their document are saved once renamed to real names (rsync's, GIO's)",
        arguments: StoreKind.all)
    func scratchFilesSurviveAReload(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        let other = try Engine(fixture)
        try await withMount(fixture.store, configure: kernelCachesForAMinute) { mount in
            let notes = mount.url("Work.pkg/notes.txt")
            // rsync's temporary of a new file, made and still empty, and GIO's of a file it
            // replaces, written and closed.
            let rsyncTemporary = mount.url("Work.pkg/.new.txt.AbCdEf")
            let gioTemporary = mount.url("Work.pkg/.goutputstream-X1Y2Z3")
            try await offThread {
                try writeText(rsyncTemporary, "")
                try writeText(gioTemporary, "GIO's bytes\n")
            }
            // Another process saves the document: the mount reloads it, scratch files and all.
            try other.replaceText("Work.pkg", "notes.txt", with: "theirs\n")
            let reloaded = try await offThread {
                eventually(timeout: 10) { try readText(notes) == "theirs\n" }
            }
            try #require(reloaded != nil, "the other process's save never showed up")
            try await offThread {
                try writeText(rsyncTemporary, "rsync's bytes\n")
                #expect(try readText(gioTemporary) == "GIO's bytes\n")
                _ = try sys(rename(rsyncTemporary, mount.url("Work.pkg/new.txt")), "rename rsync's")
                _ = try sys(rename(gioTemporary, notes), "rename GIO's")
            }
            try await expectEventually("both renames saved") {
                try other.text("Work.pkg", "new.txt") == "rsync's bytes\n"
                    && other.text("Work.pkg", "notes.txt") == "GIO's bytes\n"
            }
        }
    }

    @Test("an app's save through Document shows up in the mount (invalidated, not timed out)")
    func documentSaveShowsUp() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let other = try Engine(fixture)
        try await withMount(fixture.store, configure: kernelCachesForAMinute) { mount in
            let flat = mount.url("Flat.txt")
            #expect(try await offThread { try readText(flat) } == Fixture.flatText)
            let doc = AppTextDocument(store: other.store, name: "Flat.txt")
            #expect(await doc.open())
            #expect(doc.text == Fixture.flatText)
            doc.text = "saved by the app\n"
            doc.updateChangeCount(.done)
            #expect(await doc.save(to: doc.fileURL, for: .forOverwriting))
            await doc.close()
            let took = try await waitUntil(timeout: 10) { try readText(flat) == "saved by the app\n" }
            #expect(took != nil, "the app's save never showed up")
        }
    }

    @Test("a new document whose listing failed in the mount: listed again, else shown with its next save")
    func missedCreateHeals() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let proxy = ProxyStore(fixture.store)
        let other = try Engine(fixture)
        try await withMount(proxy, configure: kernelCachesForAMinute) { mount in
            let root = mount.path
            #expect(
                try await offThread { try FileManager.default.contentsOfDirectory(atPath: root) }.count > 0)
            // One failed listing: the mount lists again a little later.
            proxy.failListings.store(1, ordering: .sequentiallyConsistent)
            _ = try other.store.createDocument(
                named: "Soon.txt", kind: .flat, type: nil, permissions: nil, origin: "other app")
            let soon = mount.url("Soon.txt")
            let listed = try await waitUntil(timeout: 10) { FileManager.default.fileExists(atPath: soon) }
            #expect(listed != nil, "a listing that failed once was not tried again")
            // Every try fails: the document's next save brings it in.
            proxy.failListings.store(3, ordering: .sequentiallyConsistent)
            let info = try other.store.createDocument(
                named: "Late.txt", kind: .flat, type: nil, permissions: nil, origin: "other app")
            let tried = try await waitUntil(timeout: 10) {
                proxy.failListings.load(ordering: .sequentiallyConsistent) == 0
            }
            try #require(tried != nil, "the mount never listed the store after the create")
            var changes = DocumentChanges(document: info.id, base: info.currentVersion)
            changes.contents[info.root] = .replace(DataContentsSource(Data("late\n".utf8)))
            changes.origin = "other app"
            _ = try other.store.save(changes)
            let late = mount.url("Late.txt")
            let shown = try await waitUntil(timeout: 10) { (try? readText(late)) == "late\n" }
            #expect(shown != nil, "a save of a document the mount missed never brought it in")
        }
    }

    @Test("a write through the mount reloads a clean open Document (flat and package)")
    func mountWriteReloadsDocument() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let other = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let text = AppTextDocument(store: other.store, name: "Flat.txt")
            let package = AppPackageDocument(store: other.store, name: "Work.pkg")
            text.monitoringInterval = .milliseconds(100)
            package.monitoringInterval = .milliseconds(100)
            #expect(await text.open())
            #expect(await package.open())
            #expect(package.notes == Fixture.notesText)
            try await offThread {
                try writeText(mount.url("Flat.txt"), "from the mount\n")
                try writeText(mount.url("Work.pkg/notes.txt"), "notes from the mount\n")
            }
            // The documents' own monitoring finds the new versions. The model changes inside
            // `revert`, before the reload is announced, so wait for the announcement too.
            var waited = 0
            while (text.text != "from the mount\n" || package.notes != "notes from the mount\n"
                || text.reloads < 1)
                && waited < 200
            {
                try await Task.sleep(for: .milliseconds(50))
                waited += 1
            }
            #expect(text.text == "from the mount\n")
            #expect(package.notes == "notes from the mount\n")
            #expect(text.reloads >= 1)
            #expect(!text.documentState.contains(.inConflict))
            #expect(!package.documentState.contains(.inConflict))
            await text.close()
            await package.close()
        }
    }

    @Test("a write through the mount puts a Document with unsaved changes in conflict, losing nothing")
    func mountWriteConflictsWithDirtyDocument() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let other = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let doc = AppTextDocument(store: other.store, name: "Flat.txt")
            doc.monitoringInterval = .seconds(3600)
            // No autosave either: on a loaded machine it came first (after 15 s), kept the app's
            // text as the conflict version itself, and left nothing for the check below to do.
            doc.autosaveDelay = .seconds(3600)
            doc.maximumAutosaveDelay = .seconds(3600)
            #expect(await doc.open())
            doc.text = "unsaved in the app\n"
            doc.updateChangeCount(.done)
            try await offThread { try writeText(mount.url("Flat.txt"), "saved through the mount\n") }
            // Ten seconds: the whole suite on two busy cores once took more than the default 3.
            try await expectEventually("the mount's save", timeout: 10) {
                try other.text("Flat.txt") == "saved through the mount\n"
            }
            // A check finds nothing while the document is busy: the app checks again, as its
            // monitor would.
            var noticed = false
            for _ in 0..<50 where !noticed {
                noticed = await doc.checkForExternalChanges()
                if !noticed { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(noticed)
            #expect(doc.documentState.contains(.inConflict))
            #expect(doc.text == "saved through the mount\n")
            let conflicts = await doc.unresolvedConflictVersions()
            #expect(conflicts.count == 1)
            if let conflict = conflicts.first {
                let wrapper = try conflict.fileWrapper()
                #expect(wrapper.regularFileContents == Data("unsaved in the app\n".utf8))
            }
            // The mount keeps showing the current version (the mount's save).
            let shown = try await waitUntil(timeout: 3) {
                try readText(mount.url("Flat.txt")) == "saved through the mount\n"
            }
            #expect(shown != nil)
            #expect(try other.versions("Flat.txt").contains { $0.isConflict })
            await doc.close()
        }
    }
}
