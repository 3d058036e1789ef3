import DocumentEngine
import Foundation
@testable import PostgresStore
import StoreTestSupport
import Synchronization
import TestSupport
import Testing

/// What only the PostgreSQL store has: URLs, foreign databases, deferred commits, notifications,
/// and losing the server. (Everything both stores share runs in the parameterised suites.)
@Suite(.enabled(if: StoreKind.postgresURL != nil))
struct PostgresStoreTests {
    @Test("URLs: user, password, host, port, database, sslmode; PG variables fill in the rest")
    func urls() throws {
        let full = try PostgresStore.Configuration(
            url: "postgres://ann:s%40cret@db.example:6543/docs?sslmode=require", environment: [:])
        #expect(full.user == "ann" && full.password == "s@cret")
        #expect(full.host == "db.example" && full.port == 6543 && full.database == "docs" && full.requireTLS)
        #expect(full.url == "postgres://ann@db.example:6543/docs", "no password in messages")
        let environment = [
            "PGHOST": "/run/postgresql", "PGPORT": "5433", "PGUSER": "bob", "PGPASSWORD": "pw",
            "PGDATABASE": "d",
        ]
        let bare = try PostgresStore.Configuration(url: "postgresql://", environment: environment)
        #expect(bare.host == "/run/postgresql" && bare.port == 5433 && bare.user == "bob")
        #expect(bare.password == "pw" && bare.database == "d" && !bare.requireTLS)
        #expect(throws: DocumentStoreError.self) {
            try PostgresStore.Configuration(url: "postgres://h/d?sslmode=sometimes", environment: [:])
        }
        #expect(throws: DocumentStoreError.self) { try PostgresStore.Configuration(url: "/tmp/x.docstore") }
    }

    @Test("A database without a store, or with another application's tables, is refused by name")
    func foreignDatabases() throws {
        let database = try StoreFixture.newDatabase()
        defer { try? PostgresStore.dropDatabase(database) }
        #expect(
            throws: DocumentStoreError.notAStore(
                path: database.url, reason: "the database has no DocFS store")
        ) {
            try PostgresStore(configuration: database)
        }
        let fixture = try StoreFixture(.postgres)
        try fixture.sql("UPDATE store_meta SET value = 99 WHERE key = 'format'")
        #expect(throws: DocumentStoreError.newerFormat(path: fixture.location, found: 99, supported: Int(PostgresSchema.formatVersion))) {
            try fixture.reopen()
        }
        let other = try StoreFixture(.postgres)
        try other.sql("DROP TABLE events")
        try other.sql("DROP TABLE store_meta")
        #expect(throws: DocumentStoreError.self) {
            try PostgresStore(
                configuration: try PostgresStore.Configuration(url: other.location), options: .create)
        }
    }

    @Test("A deferred save is seen at once by another connection; synchronize() returns")
    func deferredSave() throws {
        let fixture = try StoreFixture(.postgres, chunkSize: 4096)
        let store = fixture.store
        let info = try store.createDocument(
            named: "d.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        let bytes = sampleBytes(10_000, seed: 3)
        changes.contents[info.root] = .replace(DataContentsSource(bytes))
        changes.durable = false
        let saved = try store.save(changes)
        let other = try fixture.reopen()
        #expect(try other.document(info.id).currentVersion == saved.version.id)
        #expect(try other.readContents(of: info.root, at: nil, offset: 0, count: 20_000) == bytes)
        try store.synchronize()
        try other.synchronize()
    }

    @Test("Another connection's save wakes an observer through LISTEN/NOTIFY, with no poll to find it")
    func notification() async throws {
        let fixture = try StoreFixture(.postgres)
        let reader = try fixture.reopen()
        let seen = Mutex<[ContinuousClock.Instant]>([])
        // No poll for 30 s, longer than a round may wait: only a notification (or the listener's
        // connecting, which counts as one) can wake it in time.
        let observer = try StoreObserver(store: reader, notifiedInterval: .seconds(30)) { events in
            seen.withLock { $0 += events.map { _ in .now } }
        }
        defer { observer.stop() }
        // Let the listener connect (it counts as a change, so a first poll follows).
        try await Task.sleep(for: .milliseconds(300))
        var latencies: [Duration] = []
        for round in 0..<5 {
            let start = ContinuousClock.now
            _ = try fixture.store.createDocument(
                named: "n\(round).txt", kind: .flat, type: nil, permissions: nil, origin: "")
            while seen.withLock({ $0.count }) <= round && ContinuousClock.now < start + .seconds(10) {
                try await Task.sleep(for: .milliseconds(2))
            }
            let arrived = try #require(seen.withLock { $0.count > round ? $0[round] : nil })
            latencies.append(arrived - start)
        }
        print("notification latencies: \(latencies)")
    }


    @Test(
        "Losing the server: calls fail with an I/O error (bounded), nothing half-saved; then the store and its observers resume"
    )
    func connectionLoss() async throws {
        let fixture = try StoreFixture(.postgres)
        let store = fixture.store
        let info = try store.createDocument(
            named: "a.txt", kind: .flat, type: nil, permissions: nil, origin: "")
        var first = DocumentChanges(document: info.id, base: info.currentVersion)
        first.contents[info.root] = .replace(DataContentsSource(Data("before\n".utf8)))
        let v1 = try store.save(first)
        let reader = try fixture.reopen()
        let seen = Mutex<[StoreEvent]>([])
        let observer = try StoreObserver(store: reader) { events in seen.withLock { $0 += events } }
        defer { observer.stop() }
        try await Task.sleep(for: .milliseconds(300))

        try fixture.cutConnections()
        var lost = false
        defer { if lost { try? fixture.allowConnections() } }
        lost = true
        var during = DocumentChanges(document: info.id, base: v1.version.id)
        during.contents[info.root] = .replace(DataContentsSource(Data("during\n".utf8)))
        let start = ContinuousClock.now
        do {
            _ = try store.save(during)
            Issue.record("a save without a server succeeded")
        } catch let error as DocumentStoreError {
            guard case .io = error else {
                Issue.record("not an I/O error: \(error)")
                return
            }
        }
        #expect(ContinuousClock.now - start < .seconds(15), "the failure took \(ContinuousClock.now - start)")
        #expect(throws: DocumentStoreError.self) { try store.documents() }

        try fixture.allowConnections()
        lost = false
        // The pool reconnects on the next call; the save that failed left nothing.
        #expect(try store.document(info.id).currentVersion == v1.version.id)
        #expect(try store.versions(of: info.id).count == 2)
        var after = DocumentChanges(document: info.id, base: v1.version.id)
        after.contents[info.root] = .replace(DataContentsSource(Data("after\n".utf8)))
        let v3 = try store.save(after)
        #expect(
            try reader.readContents(of: info.root, at: nil, offset: 0, count: 100) == Data("after\n".utf8))
        // The observer's listener reconnects and the observer catches up.
        let deadline = ContinuousClock.now + .seconds(5)
        while !seen.withLock({ $0.contains { $0.version == v3.version.id } })
            && ContinuousClock.now < deadline
        {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(seen.withLock { $0.contains { $0.version == v3.version.id } }, "the observer resumed")
        #expect(try store.checkIntegrity().isClean)
    }
}
