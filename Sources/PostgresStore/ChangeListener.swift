import DocumentEngine
import Foundation
import Threading

/// Listens on the store's notification channel on a connection of its own, from a dedicated
/// thread that reconnects when the connection is lost, and counts notifications.
///
/// Every (re)connection also counts as a change: notifications sent while nobody listened are
/// lost, so observers must look at the event log again.
final class ChangeListener: Sendable {
    private struct Listening: Sendable {
        var generation: UInt64 = 0
        var started = false
        var stopped = false
    }
    private typealias State = Monitor<Listening>

    private let database: PostgresDatabase
    private let channel: String
    private let state = State(Listening())
    /// How often an idle listening connection is checked: a server that vanished without closing
    /// the connection (a machine gone, a paused process) is noticed within this time.
    private static let heartbeat: Duration = .seconds(5)

    init(database: PostgresDatabase, channel: String = PostgresSchema.channel) {
        self.database = database
        self.channel = channel
    }

    /// Starts listening unless it is already; returns the current generation.
    @discardableResult
    func start() -> UInt64 {
        let (generation, starting) = state.withLock(wake: false) { listening -> (UInt64, Bool) in
            let starting = !listening.started && !listening.stopped
            if starting { listening.started = true }
            return (listening.generation, starting)
        }
        if starting {
            startDetachedThread(name: "docfs.pg-listen") { [database, state, channel] in
                Self.run(database: database, channel: channel, state: state)
            }
        }
        return generation
    }

    /// Stops listening; the thread closes its connection and ends within a fraction of a second.
    func stop() {
        state.withLock { $0.stopped = true }
    }

    func wait(after generation: UInt64, timeout: Duration) -> UInt64 {
        start()
        _ = state.wait(
            until: { $0.generation > generation || $0.stopped }, timeout: timeout, then: { _ in () })
        return state.withLock(wake: false) { $0.generation }
    }

    private static func bump(_ state: State) {
        state.withLock { $0.generation &+= 1 }
    }

    private static func isStopped(_ state: State) -> Bool {
        state.withLock(wake: false) { $0.stopped }
    }

    private static func run(database: PostgresDatabase, channel: String, state: State) {
        while !isStopped(state) {
            if let connection = try? database.connect() {
                listen(on: connection, database: database, channel: channel, state: state)
            }
            bump(state)
            // Bounded retry: the server may be restarting.
            if !isStopped(state) { Thread.sleep(forTimeInterval: 0.5) }
        }
    }

    /// Listens until the connection fails or the listener stops; closes the connection.
    private static func listen(
        on connection: PostgresConnection, database: PostgresDatabase, channel: String, state: State
    ) {
        defer { connection.close() }
        let session = SQLConnection(connection: connection, timeout: database.timeout)
        guard !isStopped(state), (try? session.query("LISTEN \(channel)")) != nil else {
            return
        }
        bump(state)
        let tick: Duration = .milliseconds(250)
        var lastHeard = ContinuousClock.now
        while !isStopped(state) {
            do {
                if try connection.awaitInput(until: .now + tick) { lastHeard = .now }
            } catch {
                return
            }
            if connection.takeNotifications() > 0 { bump(state) }
            if ContinuousClock.now - lastHeard >= heartbeat {
                guard (try? session.query("SELECT 1")) != nil else { return }
                lastHeard = .now
                if connection.takeNotifications() > 0 { bump(state) }
            }
        }
    }
}
